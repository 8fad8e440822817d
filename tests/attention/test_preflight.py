"""Memory pre-flights: every analysis that holds n² numbers per head refuses a request over
its budget in one line, before it allocates anything, naming `memory_budget=` to a Python
caller and `--memory-budget` on the command line; and each formula bounds what the
analysis really allocates."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from helpers.cli import Outcome, assert_refused, run_main
from helpers.traces import synthetic_trace
from identifiable.attention import (
    constrained_attention,
    effective_attention,
    interval_map,
    iter_effective_attention,
    null_space,
)
from identifiable.attention.preflight import effective_bytes
from identifiable.errors import IdentifiableError


def _allocated_peak(run) -> int:
    """Peak bytes torch's CPU allocator holds during `run()` (exceptions swallowed)."""
    from torch.profiler import ProfilerActivity, profile

    with (
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
        contextlib.suppress(IdentifiableError),
    ):
        run()
    held = peak = 0
    for _, nbytes in sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    ):
        held += nbytes
        peak = max(peak, held)
    return peak


TRACE = synthetic_trace(n=96, layers=2, heads=3, d_v=4, d=10, causal=True, seed=5)
CALLS = {
    "effective_attention": lambda b: effective_attention(TRACE, memory_budget=b),
    "iter_effective_attention": lambda b: next(iter_effective_attention(TRACE, memory_budget=b)),
    "null_space": lambda b: null_space(TRACE, memory_budget=b),
    "interval_map": lambda b: interval_map(TRACE, layers=[0], heads=[0], memory_budget=b),
    "constrained_attention": lambda b: constrained_attention(TRACE, 0, 0, memory_budget=b),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_refused_in_one_line_before_any_allocation(name):
    with pytest.raises(IdentifiableError) as err:
        CALLS[name](1000)
    python, cli = str(err.value), err.value.for_cli()
    assert python.startswith(f"{name} needs about ") and "\n" not in python
    assert "memory_budget= of 1 MB" in python or "memory_budget= of 0.001 MB" in python
    assert "--memory-budget" in cli and "memory_budget=" not in cli
    n2 = TRACE.n_tokens**2 * 4
    assert _allocated_peak(lambda: CALLS[name](1000)) < n2  # not one map was allocated
    CALLS[name](1 << 40)  # a budget that fits runs


def test_a_budget_must_be_a_positive_number_of_bytes():
    for bad in (0, -5, 1.5, True, "1GB"):
        with pytest.raises(IdentifiableError, match="memory_budget= takes a number of bytes"):
            effective_attention(TRACE, memory_budget=bad)  # type: ignore[arg-type]


def test_the_formula_bounds_what_effective_attention_allocates():
    trace = synthetic_trace(n=256, layers=3, heads=4, d_v=8, d=24, causal=True, seed=6)
    need = effective_bytes(trace, 3, 4, torch.float32, out=True)
    peak = _allocated_peak(lambda: effective_attention(trace, dtype=torch.float32))
    result = 3 * 4 * 256 * 256 * 4
    assert result <= peak <= need, (result, peak, need)


def test_a_cuda_trace_is_checked_against_the_devices_free_memory(monkeypatch):
    """On a GPU the free memory there bounds the call (a mocked device_room)."""
    from helpers.fakedevice import on_fake_device
    from identifiable.models import budget

    monkeypatch.setattr(budget, "device_room", lambda device: 1 << 20)
    with on_fake_device():
        fake = TRACE.to("meta")
        with pytest.raises(IdentifiableError, match=r"on meta .* over the 1.05 MB free there"):
            effective_attention(synthetic_trace(n=600, layers=1, heads=2, d_v=4, d=10).to("meta"))
        del fake


def test_context_mixing_is_refused_before_the_model_runs(tiny_model, monkeypatch):
    from identifiable.mixing import context_mixing

    model = tiny_model("bert")
    monkeypatch.setattr(model, "trace", lambda *a, **k: pytest.fail("the model ran"))
    with pytest.raises(IdentifiableError, match="context mixing by rollout needs about") as err:
        context_mixing(model, "the cat sat on the mat", "rollout", memory_budget=100)
    assert "--memory-budget" in err.value.for_cli()


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory, bert_tokenizer) -> Path:
    from helpers.families import build_tiny_hf_model

    root = tmp_path_factory.mktemp("preflight") / "tiny-bert"
    build_tiny_hf_model("bert").save_pretrained(root)
    bert_tokenizer.save_pretrained(root)
    return root


@pytest.mark.parametrize(
    ("command", "expect"),
    [
        (["attention"], "iter_effective_attention needs about"),
        (["attention", "--layer", "0", "--head", "0"], "needs about"),
        (["certify", "--layer", "0", "--head", "0"], "interval_map needs about"),
        (["mixing", "--method", "rollout"], "context mixing by rollout needs about"),
        (["view", "--no-certify", "--out", "{tmp}/v.html"], "effective_attention needs about"),
        (["attribution", "--probes", "2"], "--memory-budget"),
    ],
)
def test_the_cli_names_its_flag(bert_dir, tmp_path, capsys, command, expect):
    words = "the cat sat on the mat while the dog slept by the door of an old house"
    text = " ".join(words.split()[i % 17] for i in range(110))  # ≈ 112 of 128 positions
    args = [command[0], text, *(a.format(tmp=tmp_path) for a in command[1:])]
    refused = Outcome(*run_main([*args, "--model", str(bert_dir), "--memory-budget", "1"],
                                capsys))  # fmt: skip
    assert_refused(refused, expect)
    assert "--memory-budget" in refused.err and "memory_budget=" not in refused.err
