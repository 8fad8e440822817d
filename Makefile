.PHONY: setup setup-tf4 run test test-fast test-durations test-tf4 lint bench clean

setup:
	./scripts/setup.sh

# The main job: the reproduction report on the embedded model and the Wikipedia sample.
# Two ranks of one thread each (torch.distributed, gloo): the shards of every stage are
# split between them, and the output is byte-identical to one process on one thread
# (tests/distributed). One OpenMP thread per process also avoids the stalls of two threads
# on a machine whose other core is busy (benchmarks/bench_distributed.py).
run: setup
	OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node 2 \
		-m identifiable reproduce --force

# The suite on both cores: two pytest workers (pytest-xdist) of one OpenMP thread each, one
# test file per worker at a time (its module fixtures built once); tests that compare one
# thread with two, or launch processes of their own, set their threads themselves.
PYTEST = OMP_NUM_THREADS=1 .venv/bin/python -m pytest -n 2 --dist loadfile

test: setup
	.venv/bin/ruff check src tests benchmarks
	.venv/bin/mypy
	$(PYTEST) -q

# The unit tier: no embedded model, no browser, no torchrun, no test that took over 0.5 s
# when last recorded (tests/helpers/tiers.py, tests/durations.json).
test-fast: setup
	$(PYTEST) -q -m "not slow"

# Run everything once and rewrite tests/durations.json (the record the tiers are cut from).
test-durations: setup
	IDENTIFIABLE_WRITE_DURATIONS=tests/durations.json $(PYTEST) -q

# The low end of the transformers range in pyproject.toml (the newest 4.x) needs its own
# environment (huggingface_hub < 1.0): the model-facing tests run there too. The
# browser, docs, notebook and adversarial suites stay on .venv (transformers 5.x).
TF4_TESTS = tests/models tests/attention tests/attribution tests/mixing tests/integrations \
	tests/cli/test_attention.py tests/cli/test_attribution.py tests/cli/test_certify.py \
	tests/cli/test_mixing.py tests/cli/test_trace_families.py

setup-tf4:
	./scripts/setup_tf4.sh

test-tf4: setup-tf4
	OMP_NUM_THREADS=2 .venv-tf4/bin/python -m pytest -q -p no:cacheprovider $(TF4_TESTS)

lint:
	.venv/bin/ruff check src tests benchmarks
	.venv/bin/ruff format --check src tests benchmarks
	.venv/bin/mypy

bench:
	for b in benchmarks/bench_*.py; do .venv/bin/python $$b || exit 1; done

clean:
	rm -rf .venv .venv-tf4 reports artifacts .pytest_cache
