"""The attention viewer for one text or image: runs the model and the attention analysis,
then renders the page with `identifiable.viewer.page.viewer_html`.

For an image model (ViT, DeiT, CLIP's vision tower) the tokens are [CLS] (DeiT: then [DIST])
and the patches row by row, named "patch(r,c)"; `patch_grid` lays them out on the grid and
the page shows that grid, over the image when there is one, in place of the token strip.

This sits on the top floor with `cli/`: it computes (trace, effective attention, the
chosen head's interval map and constrained effective attention, witnesses) and hands
plain arrays to the report floor, which only renders.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from identifiable.errors import IdentifiableError
from identifiable.models.arguments import check_model
from identifiable.models.protocol import TracedModel
from identifiable.viewer.encoding import (
    IDENTIFIABLE_BELOW,
    CertifiedHead,
    IntervalRow,
    MixingMaps,
    PatchGrid,
    null_fraction,
    png_bytes,
    spread_order,
)
from identifiable.viewer.page import (
    DEFAULT_INTERVAL_SECONDS,
    ViewerOptions,
    ViewerPage,
    _ranges,
    viewer_html,
)

if TYPE_CHECKING:
    from identifiable.models.trace import Trace


def build_viewer(
    model: TracedModel, text: Any, options: ViewerOptions | None = None, **changes: Any
) -> str:
    """Trace `text` with `model` and build the viewer page for it.

    text: a text or a pair (a, b); for an image model, the image as `Model.trace` takes it
    (a PIL image, `pixel_values` `[C, H, W]` or `[1, C, H, W]`, or an image processor's
    output). The page then shows the patch grid; with `show_image` the image the model saw
    is drawn under it (an embedded PNG).
    options: a `ViewerOptions` (layer, head, rows, max_rows, variant, max_bytes, mixing,
    certify, interval_seconds, identifiable_below, show_image); `changes` are any of its
    fields as keywords (`build_viewer(model, text, layer=3, mixing=["rollout"])`).
    mixing: context-mixing methods (`identifiable.mixing.method_names()`) whose per-layer
    maps the page offers in place of raw, effective and null attention.
    certify, interval_seconds, identifiable_below: see `viewer_html_for_trace`.
    """
    check_model(model)
    opts = ViewerOptions.of(options, changes)
    maps = mixing_maps(model, text, opts.mixing)
    trace: Trace = model.trace(text)
    image = None
    if getattr(model, "modality", "text") == "image":
        check_grid(model, trace.tokens)
        if opts.show_image:
            image = image_rgb(model, text)
    return viewer_html_for_trace(trace, opts, mixing=maps, image=image)


_PATCH = re.compile(r"patch\((\d+),(\d+)\)")


def patch_grid(
    tokens: Sequence[str], image: np.ndarray | None = None, image_note: str = ""
) -> PatchGrid | None:
    """The patch grid of an image model's tokens, or None when they are not one.

    tokens: as an image model's trace names them: special tokens in brackets ("[CLS]",
    DeiT's "[DIST]") first, then "patch(r,c)" row by row filling a rows × cols grid.
    Anything else (any text) is not a grid. image: `[H, W, 3]` uint8 (`image_rgb`), drawn
    under the grid; image_note says how its colours were recovered.
    """
    k = 0
    while k < len(tokens) and re.fullmatch(r"\[[^\]]+\]", tokens[k]):
        k += 1
    found = [_PATCH.fullmatch(t) for t in tokens[k:]]
    if k == 0 or not found or not all(found):
        return None
    cells = [(int(m.group(1)), int(m.group(2))) for m in found if m]
    rows, cols = cells[-1][0] + 1, cells[-1][1] + 1
    if cells != [(r, c) for r in range(rows) for c in range(cols)]:
        return None
    return PatchGrid(
        rows=rows,
        cols=cols,
        patches=tuple(range(k, len(tokens))),
        special=tuple(range(k)),
        image_png=None if image is None else png_bytes(image),
        image_note=image_note,
    )


def check_grid(model: TracedModel, tokens: Sequence[str]) -> PatchGrid:
    """The grid of an image model's trace, checked against its config (image_size //
    patch_size along each side): a page must not draw patches where the model has none."""
    grid = patch_grid(tokens)
    cfg = model.hf_model.config
    size, patch = getattr(cfg, "image_size", None), getattr(cfg, "patch_size", None)
    want = None
    if size is not None and patch is not None:
        sz = (size, size) if isinstance(size, int) else tuple(size)
        ps = (patch, patch) if isinstance(patch, int) else tuple(patch)
        want = (int(sz[0]) // int(ps[0]), int(sz[1]) // int(ps[1]))
    if grid is None or (want is not None and (grid.rows, grid.cols) != want):
        got = "no patch grid" if grid is None else f"a {grid.rows} × {grid.cols} grid"
        raise IdentifiableError(
            f"the trace's tokens make {got}, but the model's config (image_size "
            f"{size}, patch_size {patch}) says "
            + (f"{want[0]} × {want[1]}" if want else "an image model")
            + "; trace the image with this model"
        )
    return grid


def image_rgb(model: TracedModel, image: Any) -> tuple[np.ndarray, str]:
    """The image the model saw, as `[H, W, 3]` uint8, and how its colours were recovered.

    The pixels are the model's own input (after its image processor: resized and cropped
    as the patches are), so the grid lines up with them. The processor's normalisation
    (x − mean) / std is undone when the model has a processor that states it; otherwise
    (pixel_values given directly) the values are scaled min–max to 0..255, which keeps
    their pattern but not their absolute colours. One channel is shown as grey.
    """
    px = model.encode(image).pixel_values
    if px is None:
        raise IdentifiableError("image_rgb takes an image for an image model")
    x = px.detach().double().cpu().numpy()  # [C, H, W]
    proc = getattr(model, "image_processor", None)
    mean, std = getattr(proc, "image_mean", None), getattr(proc, "image_std", None)
    c = x.shape[0]
    if proc is not None and getattr(proc, "do_normalize", True) and mean is not None:
        mean_a = np.broadcast_to(np.asarray(mean, np.float64), (c,))[:, None, None]
        std_a = np.broadcast_to(np.asarray(std, np.float64), (c,))[:, None, None]
        x = np.clip(x * std_a + mean_a, 0.0, 1.0)
        note = "The image as the model saw it (its image processor's normalisation undone)."
    else:
        lo, hi = float(x.min()), float(x.max())
        x = (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)
        note = (
            "The model's pixel values scaled min–max to colours (no image processor to undo "
            "its normalisation): the pattern is the model's input, the colours may not be."
        )
    rgb = x[:3] if c >= 3 else np.repeat(x.mean(axis=0, keepdims=True), 3, axis=0)
    return np.rint(rgb.transpose(1, 2, 0) * 255).astype(np.uint8), note


def mixing_maps(
    model: TracedModel, text: str | tuple[str, str], methods: Sequence[str]
) -> list[MixingMaps]:
    """Each method's `global_map` (rolled out where the method defines it) for the viewer.

    Unknown names fail in one line before any method runs."""
    from identifiable.mixing import context_mixing, get_method

    names = list(dict.fromkeys(methods))
    for name in names:
        get_method(name)
    out = []
    for name in names:
        res = context_mixing(model, text, name, progress=False)
        if res.rolled is not None:
            caption = "rolled out from the input to the chosen layer; rows: receiving token"
        elif name in ("grad-input", "erasure", "hta"):
            caption = "from input token j to token i at the chosen layer's output"
        else:
            caption = "the chosen layer alone; rows: receiving token"
        out.append(MixingMaps(name, res.global_map, caption))
    return out


def viewer_html_for_trace(
    trace: Trace,
    options: ViewerOptions | None = None,
    *,
    mixing: Sequence[MixingMaps] = (),
    image: tuple[np.ndarray, str] | None = None,
    **changes: Any,
) -> str:
    """The viewer page for a trace.

    The page opens on `layer`, `head` and, when `rows` are given, on the first of them, with
    its intervals shown. The head grid is shaded by `head_distance`.

    certify: compute the chosen head's interval map and constrained effective attention
    (`certify_head`): `rows` first, then every other row in an order that keeps the rows
    done spread over the text, until `interval_seconds` have passed (at least one row is
    always done); the page states the rows covered. Witnesses (one LP each) are added for
    `rows` and up to `max_rows` rows in all. identifiable_below: interval width below which
    the page marks a weight identifiable (stated on the page). certify=False: maps only.
    mixing: per-layer maps of context-mixing methods (`mixing_maps`), selectable in the page.
    For an image model's trace (tokens that `patch_grid` lays out) the page shows the patch
    grid in place of the token strip; image: (`[H, W, 3]` uint8, note) from `image_rgb`,
    drawn under the grid (None: the grid alone).
    """
    from identifiable import attention

    o = ViewerOptions.of(options, changes)
    layer, head, rows = o.layer, o.head, o.rows
    max_bytes, identifiable_below = o.max_bytes, o.identifiable_below
    if max_bytes < 1_000_000:
        raise IdentifiableError(
            f"the page size limit must be at least 1 MB, got {max_bytes / 1e6:.2f} MB"
        )
    if not (math.isfinite(identifiable_below) and 0 < identifiable_below < 1):
        raise IdentifiableError(
            "the identifiable threshold must be an interval width between 0 and 1 "
            f"(exclusive), such as 0.01; got {identifiable_below}"
        )
    trace.check_layer(layer)
    trace.check_head(head)
    for r in rows or ():
        trace.check_row(r)
    factors = attention.compute_head_factors(trace)
    result = attention.effective_attention(
        trace,
        variant=o.variant,  # type: ignore[arg-type]
        factors=factors,
        memory_budget=o.memory_budget,
    )
    certified, intervals, note = _certified_rows(trace, o, factors)
    patches = patch_grid(trace.tokens, *(image or (None, "")))
    if image is not None and patches is None:
        raise IdentifiableError("an image can only be drawn for an image model's trace")
    note += (
        " For another head or row run: identifiable view "
        + ("--image FILE" if patches else "TEXT")
        + " --layer L --head H --rows I,J"
        f" (L in 1..{trace.n_layers} as printed, H and rows from 0)"
    )
    page = ViewerPage(
        tokens=trace.tokens,
        raw=trace.attentions,
        effective=result.effective,
        null_dims=_null_dims(result),
        head_dim=trace.head_dim,
        intervals=intervals,
        head_distance=head_distance(trace.attentions, result.effective),
        is_causal=trace.is_causal,
        model_name=trace.model_name,
        interval_note=note,
        mixing=mixing,
        certified=certified,
        patches=patches,
        options=o,
    )
    return viewer_html(page)


def _certified_rows(
    trace: Trace, o: ViewerOptions, factors: Any
) -> tuple[CertifiedHead | None, list[IntervalRow], str]:
    """The chosen head's certificate (`certify_head`), the rows given witnesses (`o.rows`
    first, up to `o.max_rows` in all while time is left) and the page's note on both."""
    layer, head, rows, max_rows = o.layer, o.head, o.rows, o.max_rows
    interval_seconds, identifiable_below = o.interval_seconds, o.identifiable_below
    certified: CertifiedHead | None = None
    intervals: list[IntervalRow] = []
    if o.certify:
        start = time.perf_counter()
        certified = certify_head(
            trace,
            layer,
            head,
            rows=rows,
            seconds=interval_seconds,
            threshold=identifiable_below,
        )
        wanted = [int(r) for r in rows or ()]
        budget = max(max_rows, len(wanted))
        for r in dict.fromkeys([*wanted, *(int(r) for r in certified.rows)]):
            if len(intervals) >= budget:
                break
            # The rows asked for (else the first row done) always get a witness; others while
            # time is left.
            late = time.perf_counter() - start > interval_seconds
            if r not in wanted and intervals and late:
                break
            intervals.append(_interval_row(trace, certified, r, factors))
        note = certified.note + (
            f" Witnesses: rows {_ranges(sorted(iv.row for iv in intervals))}." if intervals else ""
        )
        if o.posterior and intervals:
            intervals, told = with_posterior(trace, intervals, wanted, interval_seconds)
            note += told
    else:
        note = "Intervals were not computed (the page was made with --no-certify)."
    return certified, intervals, note


class _Phase:
    """Rows done so far by one computation (bands or constrained), with its time per row."""

    def __init__(self, first: int) -> None:
        self.size, self.spent, self.per_row = first, 0.0, 0.0
        self.done: list[int] = []

    def next_size(self, left: float, todo: int) -> int:
        """Rows of the next chunk: the first chunk always; later ones cut to half of `left`
        at the time per row so far, or one row when half is none but a whole row fits."""
        if not self.done:
            return min(self.size, todo)
        fits = int(0.5 * left / self.per_row) if self.per_row > 0 else self.size
        if fits < 1 and self.per_row <= left:
            fits = 1
        return max(0, min(self.size, todo, fits))

    def record(self, chunk: list[int], seconds: float) -> None:
        self.done += chunk
        self.spent += seconds
        self.per_row = max(seconds / len(chunk), self.spent / len(self.done))
        self.size = max(8, 2 * len(chunk))


def certify_head(
    trace: Trace,
    layer: int,
    head: int,
    *,
    rows: Sequence[int] | None = None,
    seconds: float = DEFAULT_INTERVAL_SECONDS,
    threshold: float = IDENTIFIABLE_BELOW,
    first_chunk: int = 1,
) -> CertifiedHead:
    """Interval map (`attention.interval_map`) and constrained effective attention
    (`attention.constrained_attention`, reference "uniform") of one head, within a time budget.

    Rows are done in chunks: `rows` first, then the others in `spread_order` (first, last,
    middle, quarters, ...), so that a budget that runs out leaves rows spread over the text.
    The two computations alternate, each getting about half of the time while both have
    rows to do (the constrained rows follow the band rows, so they are a spread prefix of
    them): constrained attention costs far more per row on long texts (about 13 s against
    2 s at 512 tokens on MiniLM), and would otherwise starve the bands.
    Chunks double in size (rows of a head are solved together, which is cheaper per row);
    before each chunk, its time per row so far (the larger of the last chunk's and the
    mean) predicts the cost, and the chunk is cut to half the `seconds` left (costs vary by
    row, so a chunk predicted to fit can run long: the margin bounds the overrun); one
    more row is done when half is none but a whole row fits. The first chunk of each
    (`rows`, else `first_chunk` rows) is always done.
    Returns arrays `[R, n]` over the R band rows, in the order done (see `CertifiedHead`).
    """

    n = trace.n_tokens
    wanted = [int(r) for r in dict.fromkeys(rows or ())]
    order = list(dict.fromkeys([*wanted, *spread_order(list(range(n)))]))
    start = time.perf_counter()
    first = len(wanted) or max(1, first_chunk)
    bands, cons = _Phase(first), _Phase(first)
    maps, weights, lps, fallbacks = _run_phases(
        trace, layer, head, order, bands, cons, deadline=start + seconds
    )
    took = time.perf_counter() - start

    def cat(get: Any) -> Any:
        return torch.cat([get(imap) for imap in maps]).numpy()

    note = _certify_note(layer, head, n, bands.done, cons.done, seconds, lps, fallbacks, took)
    raw = cat(lambda m: m.raw[0, 0])
    constrained = np.zeros_like(raw)
    for k, r in enumerate(bands.done):
        if r in weights:
            constrained[k] = weights[r]
    return CertifiedHead(
        layer=layer,
        head=head,
        rows=np.array(bands.done, dtype=np.int64),
        raw=raw,
        lower=cat(lambda m: m.lower[0, 0]),
        upper=cat(lambda m: m.upper[0, 0]),
        constrained=constrained,
        keys=cat(lambda m: m.keys[0]),
        threshold=threshold,
        n_rows=n,
        note=note,
        constrained_rows=np.array([r in weights for r in bands.done], dtype=bool),
    )


def _run_phases(
    trace: Trace,
    layer: int,
    head: int,
    order: list[int],
    bands: _Phase,
    cons: _Phase,
    *,
    deadline: float,
) -> tuple[list[Any], dict[int, np.ndarray], int, int]:
    """Chunks of interval bands (rows in `order`) and of constrained attention (rows with
    bands), the phase that has spent less first, until `deadline` or every row is done.
    Returns (interval maps, constrained row weights by row, LPs solved, HiGHS fallbacks)."""
    from identifiable import attention

    n = trace.n_tokens
    maps: list[Any] = []
    weights: dict[int, np.ndarray] = {}
    lps = fallbacks = 0
    while True:
        left = deadline - time.perf_counter()
        todo_b, todo_c = n - len(bands.done), len(bands.done) - len(cons.done)
        prefer_bands = todo_b > 0 and (todo_c == 0 or bands.spent <= cons.spent)
        phases = [(bands, todo_b), (cons, todo_c)]
        for phase, todo in phases if prefer_bands else phases[::-1]:
            size = phase.next_size(left, todo) if todo > 0 else 0
            if size >= 1:
                break
        else:
            break
        t0 = time.perf_counter()
        if phase is bands:
            chunk = order[len(bands.done) : len(bands.done) + size]
            imap = attention.interval_map(trace, layers=[layer], heads=[head], rows=chunk)
            maps.append(imap)
            lps += imap.lps_solved
            fallbacks += imap.fallbacks
        else:
            chunk = bands.done[len(cons.done) : len(cons.done) + size]
            con = attention.constrained_attention(trace, layer, head, rows=chunk)
            weights.update(zip(chunk, con.weights.numpy(), strict=True))
        phase.record(chunk, time.perf_counter() - t0)
    return maps, weights, lps, fallbacks


def _certify_note(
    layer: int,
    head: int,
    n: int,
    bands: list[int],
    constrained: list[int],
    seconds: float,
    lps: int,
    fallbacks: int,
    took: float,
) -> str:
    """The page's sentence on what `certify_head` covered within its time budget."""

    def covered(done: list[int]) -> str:
        if len(done) == n:
            return f"all {n} rows"
        return f"{len(done)} of {n} rows ({_ranges(sorted(done))})"

    stopped = len(bands) < n or len(constrained) < n
    return (
        f"Layer {layer}, head {head}: interval bands for {covered(bands)}; "
        f"constrained attention for {covered(constrained)}"
        + (
            f" (spread over the text; stopped after {seconds:g} s: raise --interval-seconds "
            "for more)"
            if stopped
            else ""
        )
        + f"; {lps} LPs solved, {took:.1f} s in all"
        + (f" ({fallbacks} LPs by HiGHS)" if fallbacks else "")
        + "."
    )


def head_distance(raw: torch.Tensor, effective: torch.Tensor) -> torch.Tensor:
    """`[L, H]` float64 ‖A − A_eff‖_F / ‖A‖_F per head (the null fraction), from raw and
    effective `[L, H, n, n]`: `identifiable.viewer.encoding.null_fraction`."""
    return null_fraction(raw, effective)


def _null_dims(result: Any) -> torch.Tensor:
    """`[L, H]` null-space dimension per head for the variant shown (causal: the last row's)."""
    ns = result.null_space
    dims = ns.dim if result.variant == "paper" else ns.dim_stochastic
    return dims[..., -1]


def _interval_row(trace: Trace, certified: CertifiedHead, row: int, factors: Any) -> IntervalRow:
    """A row's exact bounds from the interval map and a witness (one LP)."""
    from identifiable import attention

    k = int(np.flatnonzero(certified.rows == row)[0])
    wit = attention.witness(trace, certified.layer, certified.head, row, factors=factors)
    note = "" if wit.exists else f"No witness: {wit.reason}."
    return IntervalRow(
        certified.layer,
        certified.head,
        row,
        certified.raw[k],
        certified.lower[k],
        certified.upper[k],
        None if wit.weights is None else wit.weights.numpy(),
        note,
    )


POSTERIOR_SAMPLES = 200  # effective samples per row of the page's credible bands


def with_posterior(
    trace: Trace, intervals: list[IntervalRow], wanted: Sequence[int], seconds: float
) -> tuple[list[IntervalRow], str]:
    """`intervals` with the 95 % credible bands of the rows in `wanted` (else of the first
    row) under the uniform posterior over the valid rows (`attention_posterior`, seeded,
    on one thread: its steps are small kernels), and the page's sentence on them. A request
    its probe says cannot end within `seconds` is skipped, and the sentence says so."""
    from identifiable import attention
    from identifiable.utils.threads import one_thread

    rows = [iv.row for iv in intervals if iv.row in set(wanted)] or [intervals[0].row]
    iv0 = intervals[0]
    try:
        with one_thread():
            post = attention.attention_posterior(
                trace,
                iv0.layer,
                iv0.head,
                rows,
                samples=POSTERIOR_SAMPLES,
                time_budget=seconds,
                progress=False,
            )
    except IdentifiableError as err:
        return intervals, f" Credible bands not computed: {err}."
    out = []
    for iv in intervals:
        if iv.row not in rows:
            out.append(iv)
            continue
        r = rows.index(iv.row)
        # draws lie in the valid set; the LP bounds hold it within their tolerance
        lo = np.clip(post.credible_lower[0, r].numpy(), iv.lo, iv.hi)
        hi = np.clip(post.credible_upper[0, r].numpy(), iv.lo, iv.hi)
        out.append(
            replace(iv, credible_lo=lo, credible_hi=hi, posterior_note=_posterior_note(post, r))
        )
    told = f" Credible bands (uniform posterior, {POSTERIOR_SAMPLES} effective samples): "
    return out, told + f"rows {_ranges(sorted(rows))}, {post.seconds:.1f} s."


def _posterior_note(post: Any, r: int) -> str:
    """One row's posterior in words: its diagnostics, P(the top key stays) and flags."""
    if int(post.dim[0, r]) == 0:
        return "dim P = 0: the raw row is the only valid row, so the band is the raw weight."
    flags = post.flag_text(0, r)
    return (
        f"The dark band inside each interval is the 95% credible band when every valid row "
        f"is equally likely (split-R̂ {float(post.rhat[0, r]):.3f}, "
        f"{float(post.ess[0, r]):.0f} effective samples); P(the raw top key stays on top) = "
        f"{float(post.p_top_stays[0, r]):.2f}."
        + (f" Flagged: {flags}; read the band with care." if flags else "")
    )
