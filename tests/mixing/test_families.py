"""Every method on every family of the models table (tiny random configs): each one either
matches its definition on that family or refuses in one line that names the family and why."""

from __future__ import annotations

import pytest
import torch

from helpers.families import FAMILY_CONFIGS
from identifiable.errors import IdentifiableError
from identifiable.mixing import context_mixing, decompose, method_names
from identifiable.mixing.api import _Inputs, alti_output, norm_chain, value_zeroing_distances
from identifiable.models.blocks import NORM_UNDEFINED, block_norms, capture_blocks, norm_layout
from identifiable.models.hooks import HookSet, first_tensor

TEXT = "the cat sat on the mat near the river"
RECON_RTOL = 1e-5


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.norm(a.double() - b.double()) / torch.linalg.norm(b.double()))


def defined(model) -> bool:
    try:
        norm_layout(model)
    except IdentifiableError:
        return False
    return True


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_norm_based_methods_reconstruct_or_refuse(tiny_model, family):
    model = tiny_model(family)
    if not defined(model):
        assert family in NORM_UNDEFINED
        for method in ("globenc", "alti"):
            with pytest.raises(IdentifiableError, match=f"undefined for '{family}'") as err:
                context_mixing(model, TEXT, method)
            assert "\n" not in str(err.value) and "sandwich" in str(err.value)
        return
    layout = norm_layout(model)
    x = _Inputs(model, TEXT, True, True)
    tr, cap = x.trace, x.blocks
    enc = x.encoding
    again = capture_blocks(model, enc.input_ids, enc.token_type_ids)
    assert rel(again.layer_out, tr.hidden_states[1:]) < 1e-6
    globenc = context_mixing(model, TEXT, "globenc").layerwise
    alti = context_mixing(model, TEXT, "alti").layerwise
    for layer, (first, second) in enumerate(block_norms(model)):
        # The parameters reproduce the modules (Gemma's 1 + weight included)…
        if first is not None:
            assert rel(first(cap.first_in[layer]), cap.first_out[layer]) < 1e-5
        assert rel(second(cap.second_in[layer]), cap.second_out[layer]) < 1e-5
        # …and the stated wiring is the model's: what each norm reads.
        x_in, attn = tr.hidden_states[layer].double(), tr.attn_outputs[layer].double()
        if layout.kind == "post":
            assert rel(cap.first_in[layer], x_in + attn) < 1e-5
        elif layout.kind == "pre":
            assert rel(cap.second_in[layer], x_in + attn) < 1e-5
        else:  # parallel: the MLP's norm reads the layer input, not x + Attn
            assert rel(cap.second_in[layer], x_in) < 1e-6
        # The decomposition reconstructs what ALTI decomposes, and ALTI matches its formula.
        chain, scales = norm_chain(x, layer, second_norm=False)
        parts, rest = decompose.decomposition(x.pieces(layer), chain, scales)
        y = alti_output(x, layer)
        assert rel(parts.sum(1) + rest, y) < RECON_RTOL
        y64, t64 = y.double(), parts.double()
        c = (y64.abs().sum(-1)[:, None] - (y64[:, None] - t64).abs().sum(-1)).clamp_min(0)
        torch.testing.assert_close(alti[layer], c / c.sum(-1, keepdim=True), rtol=1e-4, atol=1e-5)
        # GlobEnc: row-normalised norms of the parts through LN1 and LN2 (post) or of the
        # residual stream's parts (pre, parallel).
        chain, scales = norm_chain(x, layer, second_norm=layout.kind == "post")
        norms = decompose.decomposition(x.pieces(layer), chain, scales)[0].double().norm(dim=-1)
        want = norms / norms.sum(-1, keepdim=True)
        torch.testing.assert_close(globenc[layer], want, rtol=1e-5, atol=1e-7)


def explicit_value_zeroing(model, layer: int, token: int) -> torch.Tensor:
    """Layer `layer`'s output with token `token`'s value vector zeroed in that layer only, from
    an ordinary forward pass of the whole model. A module shared across depths (ALBERT) is
    zeroed only on its `layer`-th run."""
    enc = model.encode(TEXT)
    runs = {"value": 0, "layer": 0}
    out: list[torch.Tensor] = []
    cols = model.stack.v_cols

    def zero(module, args, output):
        runs["value"] += 1
        if runs["value"] - 1 != layer:
            return None
        output = output.clone()
        output[:, token, cols] = 0
        return output

    def keep(module, args, output):
        runs["layer"] += 1
        if runs["layer"] - 1 == layer:
            out.append(first_tensor(output))

    values = list({id(m): m for m in model.stack.value_modules}.values())
    layers = list({id(m): m for m in model.layers}.values())
    with HookSet() as hooks, torch.no_grad():
        for v in values:
            hooks.post(v, zero)
        for lay in layers:
            hooks.post(lay, keep)
        model.hf_model(**model.batch_inputs([enc]))
    return out[0][0]


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_value_zeroing_equals_an_explicit_rerun_on_every_family(tiny_model, family):
    model = tiny_model(family)
    x = _Inputs(model, TEXT, True, False)
    tr = x.trace
    dist = value_zeroing_distances(x, chunk=4)
    for layer in range(tr.n_layers):
        for j in (0, tr.n_tokens // 2, tr.n_tokens - 1):
            zeroed = explicit_value_zeroing(model, layer, j)
            cos = torch.nn.functional.cosine_similarity(
                tr.hidden_states[layer + 1].double(), zeroed.double(), dim=-1
            )
            torch.testing.assert_close(dist[layer, :, j], 1 - cos, rtol=1e-4, atol=2e-6)
    assert dist.abs().sum() > 0  # zeroing a value changes something


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_every_method_runs_or_refuses_in_one_line(tiny_model, family):
    model = tiny_model(family)
    n = len(model.encode(TEXT))
    for method in method_names():
        if method == "hta":
            continue  # hidden_token_attribution has its own family tests; grad-input covers JVPs
        try:
            res = context_mixing(model, TEXT, method)
        except IdentifiableError as err:
            msg = str(err)
            assert "\n" not in msg
            # Only the norm-based decompositions may refuse (BLOOM's GELU and MoE experts
            # get forward-AD substitutes, so grad-input runs on every family).
            assert method in ("globenc", "alti"), msg
            assert family in NORM_UNDEFINED and family in msg
            continue
        assert res.layerwise.shape == (model.info.n_layers, n, n)
        assert torch.isfinite(res.layerwise).all()
        if model.info.is_causal:
            assert torch.all(res.layerwise.triu(1) == 0)
