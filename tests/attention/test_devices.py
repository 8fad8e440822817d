"""Effective attention and null spaces on the device of the trace.

No GPU here: a trace moved to the strict stand-in device of `helpers.fakedevice` (every op
that mixes it with a CPU tensor raises, as CUDA does) must give exactly the CPU's result on
every route (all keys, causal with grouped and repeated value rows, causal windows, other
key sets) and both variants. A device without float64 (MPS) is emulated the same way: its
rank decisions run on the CPU and its products in float32 on the device, equal to the
CPU's float32 result.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers.fakedevice import FakeDevice, on_fake_device, to_cpu, to_fake
from helpers.traces import synthetic_trace
from identifiable.attention import effective_attention, iter_effective_attention, null_space
from identifiable.errors import IdentifiableError


def _band(n: int, w: int) -> torch.Tensor:
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (j <= i) & (i - j < w)


def _traces() -> dict[str, object]:
    enc = synthetic_trace(n=14, d_v=4, d=10, seed=1)
    enc.values[1, :, 5:8] = enc.values[1, :, 4:5]  # repeated tokens: ones-vector decisions
    causal = synthetic_trace(n=24, heads=4, d_v=4, d=10, causal=True, seed=2)
    causal.values[:, 1] = causal.values[:, 0]  # two query heads read one value head
    causal.kv_head_of = torch.tensor([0, 0, 1, 2])
    causal.values[0, 2, 1:3] = causal.values[0, 2, 0:1]  # repeats early: the slow prefix path
    causal.values[1, 3, 2] = 2 * causal.values[1, 3, 0]  # dependent, not equal: pivot scan
    n, w = 40, 12
    windows = synthetic_trace(n=n, d_v=4, d=12, causal=True, seed=3)
    mask = torch.stack([_band(n, w), torch.ones(n, n, dtype=torch.bool).tril()])
    windows.attentions = windows.attentions * mask[:, None]
    windows.attentions /= windows.attentions.sum(-1, keepdim=True)
    windows.key_mask = mask
    local = synthetic_trace(n=16, d_v=3, d=9, seed=4)
    near = (torch.arange(16)[:, None] - torch.arange(16)[None, :]).abs() <= 5
    local.attentions = local.attentions * near
    local.attentions /= local.attentions.sum(-1, keepdim=True)
    local.key_mask = near.expand(2, 16, 16).clone()
    return {"encoder": enc, "causal": causal, "windows": windows, "keysets": local}


TRACES = _traces()


def _fake(trace):
    moved = {
        f.name: to_fake(getattr(trace, f.name))
        for f in dataclasses.fields(trace)
        if isinstance(getattr(trace, f.name), torch.Tensor)
    }
    return dataclasses.replace(trace, **moved)


@pytest.mark.parametrize("variant", ["paper", "row-stochastic"])
@pytest.mark.parametrize("route", list(TRACES))
def test_effective_attention_on_the_device_equals_the_cpu(route, variant):
    trace = TRACES[route]
    cpu = effective_attention(trace, variant, dtype=torch.float64)
    with on_fake_device():
        dev = effective_attention(_fake(trace), variant, dtype=torch.float64)
        assert isinstance(dev.effective, FakeDevice) and isinstance(dev.raw, FakeDevice)
        assert isinstance(dev.null_space.dim, FakeDevice)
        effective, dims = to_cpu(dev.effective), to_cpu(dev.null_space.dim_stochastic)
    torch.testing.assert_close(effective, cpu.effective, atol=1e-12, rtol=0)
    assert torch.equal(dims, cpu.null_space.dim_stochastic)


@pytest.mark.parametrize("route", list(TRACES))
def test_null_space_and_streaming_on_the_device(route):
    trace = TRACES[route]
    cpu = null_space(trace, heads=[0, 1])
    with on_fake_device():
        fake = _fake(trace)
        dev = null_space(fake, heads=[0, 1])
        rank, dim = to_cpu(dev.rank), to_cpu(dev.dim)
        layers = [to_cpu(le.effective) for le in iter_effective_attention(fake, layers=[1])]
    assert torch.equal(rank, cpu.rank) and torch.equal(dim, cpu.dim)
    ref = next(iter_effective_attention(trace, layers=[1])).effective
    torch.testing.assert_close(layers[0], ref, atol=0, rtol=0)


@pytest.mark.parametrize("route", list(TRACES))
def test_a_device_without_float64_decides_ranks_on_the_cpu(route, monkeypatch):
    """The MPS fallback: float32 results on the device, float64 decisions on the CPU; equal
    to the CPU's own float32 result (the same products in the same precision)."""
    from identifiable.attention import effective as eff_mod
    from identifiable.attention import routes
    from identifiable.utils import precision

    def no_float64(device) -> bool:
        return torch.device(device).type == "cpu"

    for module in (precision, routes, eff_mod):
        monkeypatch.setattr(module, "has_float64", no_float64)
    trace = TRACES[route]
    cpu = effective_attention(trace, dtype=torch.float32)
    with on_fake_device():
        fake = _fake(trace)
        dev = effective_attention(fake)
        assert dev.effective.dtype == torch.float32
        effective = to_cpu(dev.effective)
        with pytest.raises(IdentifiableError, match="float64 is not available on meta"):
            effective_attention(fake, dtype=torch.float64)
    torch.testing.assert_close(effective, cpu.effective, atol=1e-6, rtol=0)


def test_a_trace_split_over_devices_is_refused():
    trace = TRACES["encoder"]
    with on_fake_device():
        split = dataclasses.replace(trace, values=to_fake(trace.values))
        with pytest.raises(IdentifiableError, match=r"move the whole trace with trace.to"):
            effective_attention(split)


def test_an_out_buffer_on_another_device_is_refused():
    trace = TRACES["encoder"]
    with on_fake_device():
        out = torch.empty(2, 3, 14, 14, device="meta")
        with pytest.raises(IdentifiableError, match="the analysis runs on the trace's"):
            effective_attention(trace, dtype=torch.float32, out=out)


def test_trace_to_moves_every_tensor():
    trace = TRACES["windows"]
    moved = trace.to(torch.float64 and "cpu")
    assert moved.device == torch.device("cpu") and moved is not trace
    assert torch.equal(moved.key_mask, trace.key_mask)
