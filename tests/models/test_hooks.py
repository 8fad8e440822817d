"""No hook survives a trace, including one whose forward pass raises."""

from __future__ import annotations

import pytest
import torch


def _hook_count(module: torch.nn.Module) -> int:
    return sum(
        len(m._forward_hooks)
        + len(m._forward_pre_hooks)
        + len(m._forward_hooks_with_kwargs)
        + len(m._forward_pre_hooks_with_kwargs)
        for m in module.modules()
    )


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_no_hooks_left_after_success(tiny_model, arch):
    m = tiny_model(arch)
    before = _hook_count(m.hf_model)
    m.trace("hello there")
    m.embed(m.encode("hello there").input_ids)
    ids = m.encode("hello there").input_ids
    m.layer_outputs(m.embed(ids), ids)
    assert _hook_count(m.hf_model) == before


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_no_hooks_left_when_forward_raises(tiny_model, arch):
    m = tiny_model(arch)
    before = _hook_count(m.hf_model)

    class Boom(RuntimeError):
        pass

    def explode(module, args, output):
        raise Boom("injected failure")

    handle = m.layers[-1].register_forward_hook(explode)
    try:
        with pytest.raises(Boom):
            m.trace("hello there")
        ids = m.encode("hello there").input_ids
        with pytest.raises(Boom):
            m.layer_outputs(m.embed(ids), ids)
    finally:
        handle.remove()
    assert _hook_count(m.hf_model) == before
