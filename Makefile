.PHONY: setup run test lint bench clean

setup:
	./scripts/setup.sh

# The main job: the reproduction report on the embedded model and the Wikipedia sample.
run: setup
	.venv/bin/identifiable reproduce --force

test: setup
	.venv/bin/ruff check src tests benchmarks
	OMP_NUM_THREADS=2 .venv/bin/python -m pytest -q

lint:
	.venv/bin/ruff check src tests benchmarks
	.venv/bin/ruff format --check src tests benchmarks
	.venv/bin/mypy

bench:
	for b in benchmarks/bench_*.py; do .venv/bin/python $$b || exit 1; done

clean:
	rm -rf .venv reports artifacts .pytest_cache
