"""Chunk planning against a memory budget, and the estimate against measured peak memory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers.hta_toy import make_toy, toy_input
from identifiable.attribution import ModelDims, jacobian_sq_norms, plan_chunk_size
from identifiable.attribution.memory import MIB, bytes_per_tangent, fixed_bytes
from identifiable.errors import IdentifiableError

BERT_BASE = ModelDims(12, 12, 768, 3072)


def test_chunk_grows_with_budget_and_is_capped_by_the_work():
    small = plan_chunk_size(128, BERT_BASE, 4, 10**6, 512 * MIB)
    large = plan_chunk_size(128, BERT_BASE, 4, 10**6, 4096 * MIB)
    assert 1 <= small < large
    per, fixed = bytes_per_tangent(128, BERT_BASE, 4), fixed_bytes(128, BERT_BASE, 4)
    assert fixed + large * per <= 4096 * MIB < fixed + (large + 1) * per
    assert plan_chunk_size(8, BERT_BASE, 4, 10, 4096 * MIB) == 10


@pytest.mark.parametrize("bad", [0, -1, float("nan")])
def test_budget_must_be_positive(bad):
    with pytest.raises(IdentifiableError, match="memory budget must be positive"):
        plan_chunk_size(128, BERT_BASE, 4, 10**6, bad)


def test_budget_too_small_for_one_tangent_says_what_to_do():
    with pytest.raises(IdentifiableError) as err:
        plan_chunk_size(512, BERT_BASE, 4, 512 * 768, 64 * MIB)
    msg, cli = str(err.value), err.value.for_cli()
    # Python callers read the argument names, the CLI its flags; both say what to do.
    assert "probes=K" in msg and "memory_budget=" in msg and "512-token" in msg
    assert "--" not in msg
    assert "--probes K" in cli and "--memory-budget" in cli and "memory_budget=" not in cli


def test_requested_chunk_over_budget_is_refused():
    per, fixed = bytes_per_tangent(64, BERT_BASE, 4), fixed_bytes(64, BERT_BASE, 4)
    budget = fixed + 10 * per
    assert plan_chunk_size(64, BERT_BASE, 4, 1000, budget, requested=10) == 10
    with pytest.raises(IdentifiableError, match="at most 10"):
        plan_chunk_size(64, BERT_BASE, 4, 1000, budget, requested=11)
    with pytest.raises(IdentifiableError, match="positive"):
        plan_chunk_size(64, BERT_BASE, 4, 1000, 0)


def test_over_budget_run_never_starts():
    calls = []
    f = make_toy(1, 16, 4)

    def counting(x):
        calls.append(x.shape)
        return f(x)

    with pytest.raises(IdentifiableError, match="memory budget"):
        jacobian_sq_norms(
            counting, toy_input(40, 16), memory_budget=1000, on_progress=lambda *a: calls.append(a)
        )
    assert len(calls) <= 1  # at most the one shape-probing primal pass, no JVP chunk


PEAK_SCRIPT = textwrap.dedent(
    """
    import sys, warnings
    import torch
    warnings.simplefilter("ignore")
    from identifiable.models import load_model
    from identifiable.attribution import jacobian_sq_norms
    from identifiable.attribution.api import model_dims
    from identifiable.attribution.memory import bytes_per_tangent

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

    torch.set_num_threads(1)
    m = load_model("minilm")
    enc = m.encode(" ".join(["word"] * 30))
    n = len(enc)
    e0 = m.embed(enc.input_ids, enc.token_type_ids)
    f = lambda x: m.layer_outputs(x, enc.input_ids)
    jacobian_sq_norms(f, e0, probes=1, chunk_size=2)  # warm up allocator and kernels
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset the peak (VmHWM) to the current resident size
    before = status("VmRSS")
    jacobian_sq_norms(f, e0, probes=4, chunk_size=128)
    print(status("VmHWM") - before, 128 * bytes_per_tangent(n, model_dims(m), 4))
    """
)


@pytest.mark.integration
@pytest.mark.skipif(
    not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc to reset peak RSS"
)
def test_memory_estimate_bounds_measured_peak():
    """Peak resident memory added by a 128-tangent chunk through the embedded model stays
    under the estimate (one chunk, in a fresh process, peak reset just before the chunk)."""
    out = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT], capture_output=True, text=True, check=True, timeout=300
    )
    measured, estimate = (int(v) for v in out.stdout.split()[-2:])
    assert measured > 0.2 * estimate, "the measurement saw almost nothing; the test lost its power"
    assert measured <= estimate
