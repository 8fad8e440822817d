"""Vision families (ViT, DeiT, CLIP's vision tower): images in, [CLS] plus named patches out.

Tiny random configs (tests/helpers/families.py VISION_CONFIGS); images are built in the test
(random pixels, a PIL image through an image processor made from its constructor).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.families import VISION_CONFIGS, VISION_FAMILIES, build_tiny_hf_model
from identifiable.attention import effective_attention, null_space
from identifiable.errors import IdentifiableError
from identifiable.models import Model


@pytest.fixture(scope="module")
def models():
    return {a: Model.from_hf(build_tiny_hf_model(a)) for a in VISION_FAMILIES}


def _pixels(seed: int = 0) -> torch.Tensor:
    return torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", VISION_FAMILIES)
def test_trace_verifies_and_names_patches(models, arch):
    m = models[arch]
    tr = m.trace(_pixels())
    errs = tr.verify()
    assert errs.max() < 1e-5, errs
    prefix = ["[CLS]", "[DIST]"] if arch == "deit" else ["[CLS]"]
    assert tr.tokens[: len(prefix)] == prefix
    assert tr.tokens[len(prefix)] == "patch(0,0)" and tr.tokens[-1] == "patch(3,3)"
    assert tr.tokens[len(prefix) + 5] == "patch(1,1)"  # row by row
    assert tr.n_tokens == len(prefix) + 16 and tr.input_ids.tolist() == list(range(tr.n_tokens))
    assert not tr.is_causal and bool(tr.key_mask.all())
    # a batch of one, and different pixels give a different trace
    torch.testing.assert_close(m.trace(_pixels()[None]).attentions, tr.attentions)
    assert not torch.allclose(m.trace(_pixels(1)).attentions, tr.attentions)


@pytest.mark.parametrize("arch", VISION_FAMILIES)
def test_effective_attention_invariant_and_hta(models, arch):
    from identifiable.attribution import hidden_token_attribution

    m = models[arch]
    tr = m.trace(_pixels())
    ea = effective_attention(tr, dtype=torch.float64)
    t = torch.einsum("lhnv,lhvd->lhnd", tr.values.double(), tr.out_proj.double())
    lhs, rhs = ea.effective @ t, tr.attentions.double() @ t
    assert ((lhs - rhs).abs() / rhs.abs().amax(dim=(-2, -1), keepdim=True)).max() < 1e-9
    assert int(null_space(tr).dim.min()) == tr.n_tokens - tr.head_dim > 0
    r = hidden_token_attribution(m, _pixels(), probes=4)
    assert r.contributions.shape == (m.info.n_layers, tr.n_tokens, tr.n_tokens)
    assert r.tokens == tr.tokens
    torch.testing.assert_close(r.contributions.sum(-1), torch.ones(2, tr.n_tokens).double())
    # the functional view reproduces the traced hidden states of this image
    torch.testing.assert_close(
        m.layer_outputs(m.embed(tr.input_ids, pixel_values=_pixels()), tr.input_ids),
        tr.hidden_states,
        atol=1e-5,
        rtol=1e-5,
    )


def test_pil_image_through_an_image_processor():
    from PIL import Image
    from transformers import ViTImageProcessor

    hf = build_tiny_hf_model("vit")
    proc = ViTImageProcessor(size={"height": 32, "width": 32})
    m = Model.from_hf(hf, image_processor=proc)
    rgb = (np.random.default_rng(0).random((40, 50, 3)) * 255).astype("uint8")
    image = Image.fromarray(rgb)
    tr = m.trace(image)
    tr.verify()
    want = proc(images=image, return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(m.trace(want).attentions, tr.attentions)
    torch.testing.assert_close(m.trace(proc(images=image, return_tensors="pt")).values, tr.values)
    with pytest.raises(IdentifiableError, match="no image processor"):
        Model.from_hf(hf).trace(image)


def test_text_to_vision_and_image_to_text_are_one_line_errors(models, tiny_model):
    vit = models["vit"]
    for bad in ("a cat", ("a", "b"), [101, 102], torch.tensor([101, 102])):
        with pytest.raises(IdentifiableError, match="is a vision model") as exc:
            vit.trace(bad)
        assert "\n" not in str(exc.value)
    with pytest.raises(IdentifiableError, match=r"expected \[3, 32, 32\]"):
        vit.trace(torch.randn(3, 64, 64))
    bert = tiny_model("bert")
    from PIL import Image

    for bad in (_pixels(), {"pixel_values": _pixels()[None]}, Image.new("RGB", (8, 8))):
        with pytest.raises(IdentifiableError, match="is a text model") as exc:
            bert.trace(bad)
        assert "\n" not in str(exc.value)


def test_full_clip_model_traces_its_vision_tower():
    from transformers import AutoConfig, CLIPModel

    vision = AutoConfig.for_model("clip_vision_model", **VISION_CONFIGS["clip_vision_model"])
    text = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4}
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("clip", vision_config=vision.to_dict(), text_config=text)
    with pytest.warns(UserWarning, match="to eager attention"):
        m = Model.from_hf(CLIPModel(cfg).eval())
    assert m.spec.name == "clip-vision"
    m.trace(_pixels()).verify()


@pytest.mark.parametrize("arch", VISION_FAMILIES)
def test_value_zeroing_on_images_equals_an_explicit_rerun(models, arch):
    """Value zeroing re-runs each layer from its captured input; for an image model the
    re-run needs pixel values of the right size only. Checked against an ordinary forward
    pass of the real pixels with token j's value zeroed in layer l only."""
    from identifiable.mixing import context_mixing
    from identifiable.mixing.api import _Inputs, value_zeroing_distances
    from identifiable.models.hooks import HookSet, first_tensor

    m = models[arch]
    px = _pixels()
    res = context_mixing(m, px, "value-zeroing")
    tr = m.trace(px)
    assert res.layerwise.shape == (tr.n_layers, tr.n_tokens, tr.n_tokens)
    dist = value_zeroing_distances(_Inputs(m, px, True, False), chunk=5)
    layers = list({id(x): x for x in m.layers}.values())
    values = list({id(x): x for x in m.stack.value_modules}.values())
    for layer in range(tr.n_layers):
        for j in (0, tr.n_tokens - 1):
            seen, out = {"v": 0}, []

            def zero(mod, args, output, layer=layer, j=j, seen=seen):
                seen["v"] += 1
                if seen["v"] - 1 != layer:
                    return None
                output = output.clone()
                output[:, j, m.stack.v_cols] = 0
                return output

            with HookSet() as hooks, torch.no_grad():
                for v in values:
                    hooks.post(v, zero)
                for lay in layers:
                    hooks.post(lay, lambda mod, a, o, out=out: out.append(first_tensor(o)))
                m.hf_model(pixel_values=px[None])
            cos = torch.nn.functional.cosine_similarity(
                tr.hidden_states[layer + 1].double(), out[layer][0].double(), dim=-1
            )
            torch.testing.assert_close(dist[layer, :, j], 1 - cos, rtol=1e-4, atol=2e-6)
    assert dist.abs().sum() > 0
