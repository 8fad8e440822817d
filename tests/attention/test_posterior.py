"""`attention_posterior` on traces: every draw is a valid row inside its certified
interval, keys permute, seeds repeat bit for bit, points say so, bad input is refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers.traces import synthetic_trace
from identifiable import AttentionPosterior, attention_posterior, interval_map
from identifiable.attention.chains import FLAG_POINT
from identifiable.errors import IdentifiableError
from identifiable.results.base import load

SAMPLES = 100


@pytest.fixture(scope="module")
def trace():
    return synthetic_trace(9, d_v=3, heads=2, seed=4)


@pytest.fixture(scope="module", params=["billiard", "hitrun"])
def post(trace, request) -> AttentionPosterior:
    out = attention_posterior(trace, 1, [0, 1], rows=[0, 3, 8], samples=SAMPLES,
                              keep_draws=True, walk=request.param, progress=False)  # fmt: skip
    assert out.walk == request.param
    return out


def _t(trace, layer: int, head: int) -> torch.Tensor:
    return trace.values[layer, head].double() @ trace.out_proj[layer, head].double()


def test_every_draw_is_a_valid_row(trace, post) -> None:
    assert post.samples_kept is not None
    for h, head in enumerate(post.heads):
        t = _t(trace, post.layer, head)
        for r, row in enumerate(post.rows):
            draws = post.samples_kept[h, r]  # [S, n]
            a = trace.attentions[post.layer, head, row].double()
            a = a / a.sum()  # the polytope holds the raw row renormalised in float64
            assert draws.shape == (SAMPLES, trace.n_keys)
            assert float(draws.min()) >= -1e-12
            assert float((draws.sum(-1) - 1).abs().max()) <= 1e-10
            target = a @ t
            err = (draws @ t - target).norm(dim=-1).max()
            assert float(err) <= 1e-8 * float(target.norm())
            assert int(post.dim[h, r]) == 9 - 3 - 1


def test_every_draw_lies_inside_the_certified_intervals(trace, post) -> None:
    imap = interval_map(trace, layers=[1], heads=[0, 1], rows=[0, 3, 8], progress=False)
    lower, upper = imap.lower[0], imap.upper[0]  # [H, R, n]
    assert torch.equal(post.lower, lower) and torch.equal(post.upper, upper)
    draws = post.samples_kept
    assert draws is not None
    # the intervals hold rows summing to Σa, the draws rows summing to 1: a scale of 1/Σa
    total = trace.attentions[1][[0, 1]][:, [0, 3, 8]].double().sum(-1, keepdim=True)
    slack = 1e-9 + upper * (1 / total - 1).abs()  # [H, R, n]
    assert bool((draws >= (lower - slack)[:, :, None]).all())
    assert bool((draws <= (upper + slack)[:, :, None]).all())
    assert bool((post.credible_lower >= lower - slack).all())
    assert bool((post.credible_upper <= upper + slack).all())


def test_causal_rows_of_different_dimensions_sample_together() -> None:
    """Rows of a causal head with different key sets and dim P_i share one padded batch:
    each draw is a valid row over its own prefix, inside its certified interval."""
    trace = synthetic_trace(12, d_v=3, heads=1, causal=True, seed=1)
    rows = [4, 6, 11]
    post = attention_posterior(trace, 0, 0, rows=rows, samples=60, keep_draws=True, progress=False)
    assert post.dim[0].tolist() == [1, 3, 8] and not bool(post.flags.any())
    imap = interval_map(trace, layers=[0], heads=[0], rows=rows, progress=False)
    t = _t(trace, 0, 0)
    assert post.samples_kept is not None
    for r, row in enumerate(rows):
        draws = post.samples_kept[0, r]
        a = trace.attentions[0, 0, row].double()
        a = a / a.sum()
        assert bool((draws[:, row + 1 :] == 0).all())  # no weight after the query
        assert float(draws.min()) >= -1e-12
        assert float((draws.sum(-1) - 1).abs().max()) <= 1e-10
        assert float((draws @ t - a @ t).norm(dim=-1).max()) <= 1e-8 * float((a @ t).norm())
        slack = 1e-6 * imap.upper[0, 0, r]
        assert bool((draws >= imap.lower[0, 0, r] - slack).all())
        assert bool((draws <= imap.upper[0, 0, r] + slack).all())
        assert float(draws[:, : row + 1].std(0).max()) > 1e-3  # the chains moved


def test_summaries_are_consistent(post) -> None:
    assert torch.allclose(post.p_top.sum(-1), torch.ones(2, 3, dtype=torch.float64))
    assert bool((post.credible_lower <= post.mean + 1e-12).all())
    assert bool((post.mean <= post.credible_upper + 1e-12).all())
    assert bool(((post.p_top_stays >= 0) & (post.p_top_stays <= 1)).all())
    sound = post.flags == 0
    assert bool((post.ess[sound] >= SAMPLES).all())
    assert bool((post.rhat[sound] <= 1.01).all())
    table = post.rows_table()
    assert len(table) == 6 and set(table.columns) >= {"ess", "rhat", "flags", "p_top_stays"}


@pytest.mark.parametrize("walk", ["billiard", "hitrun"])
def test_a_fixed_seed_repeats_bit_for_bit(trace, walk) -> None:
    def run(seed: int, **budget: float) -> AttentionPosterior:
        return attention_posterior(
            trace, 0, 1, rows=[2, 5], samples=50, seed=seed, walk=walk, progress=False, **budget
        )

    one, two, other = run(7), run(7), run(8)
    timed = run(7, time_budget=600.0)  # the budget's timed probe steps are rewound
    for f in ("mean", "credible_lower", "credible_upper", "p_top", "p_half", "ess", "rhat"):
        assert torch.equal(getattr(one, f), getattr(two, f)), f
        assert torch.equal(getattr(one, f), getattr(timed, f)), f
    assert not torch.equal(one.mean, other.mean)


def test_permuting_keys_permutes_the_output(trace) -> None:
    perm = torch.tensor([4, 0, 8, 2, 6, 1, 7, 3, 5])
    moved = dataclasses.replace(
        trace,
        attentions=trace.attentions[..., perm][:, :, perm],
        values=trace.values[:, :, perm],
        attn_outputs=trace.attn_outputs[:, perm],
        hidden_states=trace.hidden_states[:, perm],
        tokens=[trace.tokens[i] for i in perm],
        input_ids=trace.input_ids[perm],
    )
    base = attention_posterior(trace, 0, 0, rows=[4], samples=400, walk="billiard",
                               progress=False)  # fmt: skip
    perm_post = attention_posterior(moved, 0, 0, rows=[0], samples=400, walk="billiard",
                                    progress=False)  # fmt: skip
    assert torch.allclose(perm_post.upper[0, 0], base.upper[0, 0, perm], atol=1e-9)
    assert torch.allclose(perm_post.raw[0, 0], base.raw[0, 0, perm], atol=1e-7)
    gap = (perm_post.mean[0, 0] - base.mean[0, 0, perm]).abs()
    noise = (perm_post.mcse[0, 0] ** 2 + base.mcse[0, 0, perm] ** 2).sqrt()
    assert bool((gap <= 5 * noise + 1e-12).all()), (gap, noise)


def test_a_point_polytope_is_the_raw_row_and_says_so() -> None:
    small = synthetic_trace(4, d_v=4, seed=1)  # [T, 1] has full rank over 4 keys
    post = attention_posterior(small, 0, 0, samples=10, progress=False)
    assert bool((post.dim == 0).all())
    raw = small.attentions[0, 0].double()
    raw = raw / raw.sum(-1, keepdim=True)  # renormalised in float64
    assert torch.equal(post.mean[0], raw) and torch.equal(post.credible_lower[0], raw)
    assert bool((post.flags == FLAG_POINT).all())
    assert "point (dim P = 0)" in post.flag_text(0, 0)


def test_the_dirichlet_prior_runs_and_concentrates(trace) -> None:
    uni = attention_posterior(trace, 0, 0, rows=[1], samples=200, progress=False)
    tight = attention_posterior(trace, 0, 0, rows=[1], samples=200, prior="dirichlet",
                                alpha=200.0, progress=False)  # fmt: skip
    assert tight.prior == "dirichlet" and tight.alpha == 200.0
    assert float(tight.credible_width.sum()) < 0.7 * float(uni.credible_width.sum())
    gap = (tight.mean - tight.raw).abs().sum()
    assert float(gap) < float((uni.mean - uni.raw).abs().sum())


def test_result_tables_files_and_html(post, tmp_path) -> None:
    table = post.to_pandas()
    assert {"mean", "credible_lower", "credible_upper", "flags", "ess"} <= set(table.columns)
    ds = post.to_xarray()
    assert ds["mean"].dims == ("head", "row", "key")
    path = post.save(tmp_path / "post")
    back = load(path)
    assert isinstance(back, AttentionPosterior)
    assert torch.equal(back.mean, post.mean) and back.heads == post.heads
    html = post._repr_html_()
    assert "AttentionPosterior" in html
    fig = post.plot(head=1, row=3)
    assert "row 3" in fig.texts[0].get_text() if fig.texts else fig.axes


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"prior": "gauss"}, "unknown prior 'gauss'"),
        ({"walk": "gibbs"}, "unknown walk 'gibbs': use one of auto, billiard, hitrun"),
        ({"prior": "dirichlet", "alpha": 0.0}, "alpha must be a positive number"),
        ({"alpha": -1.0}, "alpha must be a positive number"),
        ({"samples": 0}, "samples must be an integer ≥ 1"),
        ({"rows": [9]}, "row"),
        ({"time_budget": 1e-4}, "more than the time budget"),
    ],
)
def test_bad_requests_are_refused_in_one_line(trace, kwargs, words) -> None:
    kwargs = {"rows": [0], "samples": 50, "progress": False, **kwargs}
    with pytest.raises(IdentifiableError) as err:
        attention_posterior(trace, 0, 0, **kwargs)
    assert words in str(err.value) and "\n" not in str(err.value)
