"""The same numbers on a GPU: tracing, effective attention, HTA, a reproduce run, NCCL ranks.

These run wherever CUDA is available (the CI machine has none, so they skip there with that
reason). `IDENTIFIABLE_TEST_DEVICE=cpu` runs their bodies on the CPU against itself, which
checks the test code on a machine without a GPU; on a GPU machine it defaults to "cuda".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from distributed.test_torchrun import _args, _outputs, _run, _torchrun, workdir  # noqa: F401

DEVICE = os.environ.get("IDENTIFIABLE_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "")
pytestmark = pytest.mark.skipif(
    not DEVICE,
    reason="no CUDA device on this machine: these tests compare GPU runs with CPU runs "
    "(IDENTIFIABLE_TEST_DEVICE=cpu exercises them here)",
)
TEXT = "The cat sat on the mat. It was happy, and so was I, for a while at least."


@pytest.fixture(scope="module")
def pairs(bert_tokenizer):
    """(CPU model, device model) per family: the same weights on both."""
    from helpers.families import build_tiny_hf_model
    from identifiable.models import Model

    out = {}
    for arch in ("bert", "gpt2", "llama"):
        cpu = Model.from_hf(build_tiny_hf_model(arch), bert_tokenizer, name=f"tiny-{arch}")
        dev = Model.from_hf(
            build_tiny_hf_model(arch).to(DEVICE), bert_tokenizer, name=f"tiny-{arch}"
        )
        out[arch] = (cpu, dev)
    return out


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_trace_and_effective_attention_on_the_device_match_the_cpu(pairs, arch):
    from identifiable.attention import effective_attention

    cpu, dev = pairs[arch]
    assert dev.device.type == torch.device(DEVICE).type
    t_cpu, t_dev = cpu.trace(TEXT), dev.trace(TEXT)
    assert float(t_dev.verify().max()) < 1e-5
    torch.testing.assert_close(t_dev.attentions, t_cpu.attentions, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(t_dev.values, t_cpu.values, atol=1e-5, rtol=1e-4)
    e_cpu, e_dev = effective_attention(t_cpu), effective_attention(t_dev)
    assert torch.equal(e_dev.null_space.dim, e_cpu.null_space.dim)
    torch.testing.assert_close(e_dev.effective, e_cpu.effective, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_hta_on_the_device_matches_the_cpu(pairs, arch):
    from identifiable.attribution import hidden_token_attribution

    cpu, dev = pairs[arch]
    r_cpu = hidden_token_attribution(cpu, TEXT, probes=8, seed=3, progress=False)
    r_dev = hidden_token_attribution(dev, TEXT, probes=8, seed=3, progress=False)
    torch.testing.assert_close(r_dev.contributions, r_cpu.contributions, atol=1e-4, rtol=1e-3)
    exact_cpu = hidden_token_attribution(cpu, TEXT, probes=None, progress=False)
    exact_dev = hidden_token_attribution(dev, TEXT, probes=None, progress=False)
    torch.testing.assert_close(exact_dev.sq_norms, exact_cpu.sq_norms, atol=1e-6, rtol=1e-3)


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_reproduce_on_the_device_writes_the_files_and_claims_of_the_cpu_run(workdir: Path) -> None:  # noqa: F811
    cpu = _run(["-m", "identifiable", *_args("gpu-ref-cpu")], workdir)
    assert cpu.returncode == 0, cpu.stderr
    dev = _run(["-m", "identifiable", *_args("gpu-dev", "--device", DEVICE)], workdir)
    assert dev.returncode == 0, dev.stderr
    a, b = _summary(workdir / "gpu-ref-cpu"), _summary(workdir / "gpu-dev")
    assert a.keys() == b.keys()
    files_a, files_b = _outputs(workdir / "gpu-ref-cpu"), _outputs(workdir / "gpu-dev")
    assert files_a.keys() == files_b.keys()  # every table and figure is written on the device too


@pytest.mark.skipif(
    DEVICE != "cuda" or torch.cuda.device_count() < 2,
    reason="NCCL needs two CUDA devices: two ranks, one GPU each",
)
def test_two_nccl_ranks_write_the_same_files_as_one_gpu(workdir: Path) -> None:  # noqa: F811
    one = _run(["-m", "identifiable", *_args("gpu-one", "--device", "cuda")], workdir)
    assert one.returncode == 0, one.stderr
    two = _torchrun(2, ["-m", "identifiable", *_args("gpu-two", "--device", "cuda")], workdir)
    assert two.returncode == 0, two.stderr
    a, b = _outputs(workdir / "gpu-one"), _outputs(workdir / "gpu-two")
    assert a.keys() == b.keys()
    # Shards are independent of the rank that ran them, so the tables are the same bytes.
    tables = [k for k in a if k.startswith("tables/") and k.endswith(".csv")]
    assert tables and all(a[k] == b[k] for k in tables), [k for k in tables if a[k] != b[k]]
