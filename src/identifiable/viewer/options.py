"""What a viewer page shows: `ViewerOptions` (the options every viewer entry point shares)
and `ViewerPage` (the plain tensors `report.viewer_page.viewer_html` renders)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from identifiable.errors import IdentifiableError
from identifiable.viewer.encoding import (
    IDENTIFIABLE_BELOW,
    CertifiedHead,
    IntervalRow,
    MixingMaps,
    PatchGrid,
)

DEFAULT_MAX_BYTES = 9_000_000
DEFAULT_MAX_ROWS = 16
DEFAULT_INTERVAL_SECONDS = 30.0


@dataclass(frozen=True)
class ViewerOptions:
    """What a viewer page shows and how large it may be: the one set of options that
    `identifiable view`, `build_viewer`, `viewer_html_for_trace` and `viewer_html` share.

    layer, head: the head shown on load (0-based). rows: query rows certified first and
    given witnesses; the page opens on the first (`viewer_html` shows only `rows[0]`).
    max_rows: witnesses at most. variant: effective attention, "paper" or
    "row-stochastic". max_bytes: the page size limit. mixing: context-mixing method names
    (`identifiable.mixing.method_names()`) offered in place of the attention maps.
    certify: compute the chosen head's interval map and constrained attention, within
    interval_seconds. identifiable_below: interval width under which a weight is marked
    identifiable. posterior: with certify, the credible band of each weight of the rows
    asked for (else of the first row certified) under the uniform posterior over the valid
    rows, within interval_seconds more. show_image: draw an image model's input under its
    patch grid.
    memory_budget: bytes the page's effective attention may use (None: the memory free).
    """

    layer: int = 0
    head: int = 0
    rows: tuple[int, ...] = ()
    max_rows: int = DEFAULT_MAX_ROWS
    variant: str = "paper"
    max_bytes: int = DEFAULT_MAX_BYTES
    mixing: tuple[str, ...] = ()
    certify: bool = True
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    identifiable_below: float = IDENTIFIABLE_BELOW
    posterior: bool = True
    show_image: bool = True
    memory_budget: int | None = None

    @classmethod
    def of(cls, options: ViewerOptions | None, changes: dict[str, Any]) -> ViewerOptions:
        """`options` (default: the defaults) with `changes` applied; `rows` and `mixing`
        may be any sequence (or None), `row` is `rows=(row,)`."""
        if options is not None and not isinstance(options, ViewerOptions):
            raise IdentifiableError(
                f"options= takes a ViewerOptions or None, got {type(options).__name__}"
            )
        known = {f.name for f in dataclasses.fields(cls)} | {"row"}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise IdentifiableError(
                f"unknown viewer option {unknown[0]}=; the options are {', '.join(sorted(known))}"
            )
        if "row" in changes:
            row = changes.pop("row")
            changes.setdefault("rows", () if row is None else (row,))
        for name in ("rows", "mixing"):
            if name in changes:
                changes[name] = tuple(changes[name] or ())
        return replace(options or cls(), **changes)


@dataclass(frozen=True)
class ViewerPage:
    """What `viewer_html` renders (plain tensors: testable without a model).

    tokens: n strings (escaped in the page). raw, effective: `[L, H, n, n]`.
    null_dims: `[L, H]` ints, dim LN(T) per head (last row for causal heads).
    head_dim: d_v. intervals: precomputed rows (any heads).
    head_distance: `[L, H]` floats, how far effective attention is from raw attention per
    head (the grid is shaded by it); None shades the grid by null-space dimension.
    mixing: context-mixing methods whose `[L, n, n]` maps can be chosen in place of the three
    attention maps (one map per layer: the head selector does not apply to them). They are
    encoded first, at full resolution within a third of `max_bytes` (else as previews).
    certified: interval bands, identifiable marks and constrained attention of rows of one
    head (`CertifiedHead`), encoded next within a third of what is left (`encode_certified`
    says how it shrinks); the heads get the rest.
    patches: for an image model, where its tokens lie on the image (`PatchGrid`): the
    page shows a patch grid in place of the token strip (clicking a cell chooses the
    query; every key cell is shaded by the chosen map's weight from it) and, when the
    grid holds a PNG, the image under it. The PNG's bytes come off `max_bytes` first.
    options: layer, head, rows (the page opens on rows[0] with its intervals shown),
    variant and max_bytes are read from it.
    """

    tokens: Sequence[str]
    raw: torch.Tensor
    effective: torch.Tensor
    null_dims: torch.Tensor
    head_dim: int
    intervals: Sequence[IntervalRow] = ()
    head_distance: torch.Tensor | None = None
    is_causal: bool = False
    model_name: str = ""
    interval_note: str = ""
    mixing: Sequence[MixingMaps] = ()
    certified: CertifiedHead | None = None
    patches: PatchGrid | None = None
    options: ViewerOptions = field(default_factory=ViewerOptions)

    @classmethod
    def of(cls, page: ViewerPage | None, fields: dict[str, Any]) -> ViewerPage:
        """`page`, or one made of keyword `fields`: ViewerPage's own plus ViewerOptions'
        (layer=, head=, row=, variant=, max_bytes=, ...), as `viewer_html` takes them."""
        if page is not None:
            if not isinstance(page, ViewerPage):
                raise IdentifiableError(
                    f"page= takes a ViewerPage (or its fields as keywords), got "
                    f"{type(page).__name__}"
                )
            return page
        names = {f.name for f in dataclasses.fields(cls)}
        own = {k: v for k, v in fields.items() if k in names}
        changes = {k: v for k, v in fields.items() if k not in names}
        options = ViewerOptions.of(own.get("options"), changes)
        needed = ("tokens", "raw", "effective", "null_dims", "head_dim")
        missing = [name for name in needed if name not in own]
        if missing:
            raise IdentifiableError(
                f"the viewer needs {', '.join(n + '=' for n in missing)} (or a ViewerPage); "
                "build_viewer(model, text) makes them from a model"
            )
        for name in ("raw", "effective", "null_dims"):
            if not isinstance(own[name], torch.Tensor):
                raise IdentifiableError(f"{name}= takes a tensor, got {type(own[name]).__name__}")
        return cls(**own | {"options": options})
