"""Where the probe fits start and what they keep: the plain MLP starts at the linear probe
(pairs of ReLU units), and linear-cos keeps the state a validation score chooses."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from identifiable.tokens.adam import Net, Standardised
from identifiable.tokens.fitting import RidgeSolver, closed_form, fit_probes
from identifiable.tokens.lbfgs import refine_linear
from identifiable.tokens.probes import ProbeConfig, objective_loss


def _data(n=500, n_val=150, d=6, d_out=5, seed=0):
    """A noisy affine map with unequal input scales plus a quadratic part (MLP > linear)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n + n_val, d, generator=g) * torch.linspace(0.5, 3.0, d) + 2.0
    w = torch.randn(d, d_out, generator=g)
    y = x @ w + 0.5 * (x[:, :d_out] - 2.0) ** 2 + 0.1 * torch.randn(n + n_val, d_out, generator=g)
    return x[:n], y[:n], x[n:], y[n:]


@pytest.mark.parametrize("objective", ["l2", "cos"])
def test_plain_mlp_starts_exactly_at_the_linear_probe(objective):
    x, y, xv, yv = _data()
    cfg = ProbeConfig(mlp_width="auto")
    linear = closed_form(RidgeSolver(x), y, xv, yv, objective, cfg).probe
    data = Standardised.of(x, y, xv, yv)
    net = Net("mlp", data, objective, cfg, torch.Generator().manual_seed(0), linear)
    assert net.w1.shape[1] == 512  # max(512, 2d)
    with torch.no_grad():
        assert torch.allclose(net(None), linear(xv), atol=1e-4, rtol=1e-4)
        assert torch.allclose(net.probe(objective)(xv), linear(xv), atol=1e-4, rtol=1e-4)
    # a random start is far from it (the test can fail)
    rand = Net("mlp", data, objective, cfg, torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.allclose(rand(None), linear(xv), atol=1e-1)


def test_a_narrow_mlp_starts_at_the_linear_probe_s_best_low_rank_part():
    x, y, xv, yv = _data()
    cfg = ProbeConfig(mlp_width=4)  # 2 pairs: rank 2 of a rank-5 map
    linear = closed_form(RidgeSolver(x), y, xv, yv, "l2", cfg).probe
    data = Standardised.of(x, y, xv, yv)
    net = Net("mlp", data, "l2", cfg, torch.Generator().manual_seed(0), linear)
    w, b = data.affine_from(linear, y.shape[1])
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    rank2 = data.z_val @ (u[:, :2] @ torch.diag(s[:2]) @ vh[:2]) + b
    with torch.no_grad():
        assert torch.allclose(net(None), rank2, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("objective", ["l2", "cos"])
def test_mlp_from_the_linear_start_never_ends_worse_than_the_linear_probe(objective):
    x, y, xv, yv = _data()
    kinds = [("linear", objective), ("mlp", objective)]
    cfg = ProbeConfig(mlp_width=16, max_steps=5000, select_steps=30)
    fits = fit_probes(x, y, xv, yv, kinds, config=cfg, seed=1)
    lin, mlp = fits[kinds[0]], fits[kinds[1]]
    assert mlp.val_loss_start == pytest.approx(
        float(objective_loss(lin.probe(xv), yv, objective)), rel=1e-3
    )
    assert mlp.val_loss < 0.95 * mlp.val_loss_start  # Adam improved on the start here
    assert mlp.stopped == "patience" and mlp.converged()


def test_linear_cos_keeps_the_state_its_validation_score_chooses():
    x, y, xv, yv = _data(seed=2)
    cfg = ProbeConfig(lbfgs_every=1, cos_patience=None, cos_steps=40)
    start = closed_form(RidgeSolver(x), y, xv, yv, "cos", cfg).probe
    seen: list[torch.Tensor] = []

    def third_check(pred: torch.Tensor) -> float:  # peaks at the third check: iteration 2
        seen.append(pred)
        return -abs(len(seen) - 3)

    fit = refine_linear(x, y, xv, yv, "cos", start, cfg, third_check)
    assert fit.extras["val_score"] == 0 and fit.extras["val_score_start"] == -2
    with torch.no_grad():
        assert torch.allclose(fit.probe(xv), seen[2], atol=1e-4)
    by_loss = refine_linear(x, y, xv, yv, "cos", start, cfg)
    assert by_loss.val_loss <= fit.val_loss  # the loss alone keeps another state
    assert "val_score" not in by_loss.extras
    # patience on a score: stops once the score has not risen for `cos_patience` checks
    seen.clear()
    patient = refine_linear(x, y, xv, yv, "cos", start, replace(cfg, cos_patience=4), third_check)
    assert patient.stopped == "patience" and patient.steps == 2 + 4  # best at iteration 2


def test_evaluation_records_the_validation_rate_of_linear_cos():
    from helpers.token_pairs import synthetic_pairs
    from identifiable.tokens.evaluate import evaluate_pairs

    pairs = synthetic_pairs(n_seq=40, d=8, n_layers=2)
    ev = evaluate_pairs(
        pairs, probe_kinds=("linear",), layers=[2], cross_layer=(), controls=(),
        probe_config=ProbeConfig(cos_steps=50),
    )  # fmt: skip
    rows = ev.per_layer.set_index("objective")
    cos = rows.loc["cos"]
    assert cos["optimizer"] == "L-BFGS" and 0 < cos["val_rate"] <= 1
    assert cos["val_rate"] >= cos["val_rate_start"]
    assert rows.loc["l2", "val_rate"] != rows.loc["l2", "val_rate"]  # NaN: closed form


@pytest.mark.parametrize("objective", ["l2", "cos"])
def test_bfloat16_products_fit_the_mlp_as_float32_does(objective):
    """Mixed precision (bfloat16 minibatch products, float32 weights and validation) lands
    within 2 % of the float32 fit's validation loss, from the same start on the same
    minibatches, where the residual is far above bfloat16's 0.4 % rounding (as in probes of
    hidden states); the two fits differ (the bfloat16 path really ran) and the probe is
    float32."""
    x, y, xv, yv = _data(seed=3)
    g = torch.Generator().manual_seed(5)
    y, yv = (
        y + 3.0 * torch.randn(y.shape, generator=g),
        yv + 3.0 * torch.randn(yv.shape, generator=g),
    )
    kinds = [("mlp", objective)]
    fits = {}
    for precision in ("float32", "bfloat16"):
        cfg = ProbeConfig(mlp_width=16, max_steps=600, select_steps=30, adam_precision=precision)
        fits[precision] = fit_probes(x, y, xv, yv, kinds, config=cfg, seed=1)[kinds[0]]
    f32, b16 = fits["float32"], fits["bfloat16"]
    assert f32.val_loss_start == b16.val_loss_start
    assert b16.val_loss < 0.95 * b16.val_loss_start
    assert b16.val_loss == pytest.approx(f32.val_loss, rel=0.02)
    assert b16.val_loss != f32.val_loss
    assert b16.probe.hidden_in is not None and b16.probe.hidden_in.dtype == torch.float32


def test_auto_precision_is_bfloat16_only_where_the_device_multiplies_it(monkeypatch):
    from identifiable.errors import IdentifiableError
    from identifiable.tokens.adam import training_dtype

    cpu = torch.device("cpu")
    for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: False)
    assert training_dtype("auto", cpu) == torch.float32
    assert training_dtype("bfloat16", cpu) == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert training_dtype("auto", cpu) == torch.bfloat16
    assert training_dtype("float32", cpu) == torch.float32
    assert training_dtype("auto", torch.device("meta")) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert training_dtype("auto", torch.device("cuda")) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert training_dtype("auto", torch.device("cuda")) == torch.bfloat16
    with pytest.raises(IdentifiableError, match="adam_precision"):
        ProbeConfig(adam_precision="float16")  # type: ignore[arg-type]


@pytest.mark.parametrize("objective", ["l2", "cos"])
def test_mlp_keeps_a_linear_start_that_identifies_every_validation_token(objective):
    """At a validation rate of 100 % the MLP keeps its linear start untrained ("ceiling");
    below it, Adam trains from the same start."""
    x, y, xv, yv = _data(seed=4)
    kinds = [("linear", objective), ("mlp", objective)]
    cfg = ProbeConfig(mlp_width=16, max_steps=200, select_steps=20)
    for rate, trained in ((1.0, False), (0.5, True)):
        fits = fit_probes(x, y, xv, yv, kinds, config=cfg, seed=1, val_score=lambda p, o, r=rate: r)
        lin, mlp = fits[kinds[0]], fits[kinds[1]]
        assert (mlp.stopped != "ceiling") == trained and (mlp.steps > 0) == trained
        if not trained:
            assert mlp.extras["kept_start"] == 1.0 and mlp.extras["val_score"] == 1.0
            assert mlp.probe.kind == "mlp" and mlp.val_loss == lin.val_loss
            with torch.no_grad():
                assert torch.equal(mlp.probe(xv), lin.probe(xv))
