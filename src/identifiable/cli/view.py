"""`identifiable view`: one text (or, for an image model, one image), one offline
interactive attention page."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from identifiable.cli.common import (
    check_model_name,
    check_reads_text,
    check_writable,
    console,
    index_list,
    load,
    mib,
)
from identifiable.cli.options import ForceOption, MemoryBudgetOption, ModelOption, PairOption
from identifiable.errors import IdentifiableError

if TYPE_CHECKING:
    from identifiable.viewer.page import ViewerOptions

# Finite bounds, so that what is computed from them (bytes, deadlines) stays finite:
# 1e308 passed the isfinite checks and overflowed in int(max_mb * 1e6).
MAX_PAGE_MB = 1e6  # a terabyte: no browser opens a page that large
MAX_INTERVAL_S = 1e6


def _read_image(path: Path) -> Any:
    """An image file as a PIL image, or pixel values `[C, H, W]` from a .npy file; a file that
    is neither, or larger than PIL's decompression-bomb limit, fails in one line before the
    model loads."""
    if path.is_dir():
        raise IdentifiableError(f"--image {path} is a folder; give an image file (PNG, JPEG)")
    if not path.is_file():
        raise IdentifiableError(f"--image {path}: no such file; give an image file (PNG, JPEG)")
    if path.suffix.lower() == ".npy":
        return _read_npy(path)
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:  # reads the header only; PIL checks the size here
            return im.convert("RGB")
    except Image.DecompressionBombError:
        raise _too_many_pixels(path, _header_pixels(path)) from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise IdentifiableError(
            f"--image {path}: not an image file that can be read ({type(exc).__name__}); "
            "give a PNG or JPEG, or pixel values [C, H, W] as .npy"
        ) from None


def _max_pixels() -> int:
    """PIL's limit: an image above it is refused as a possible decompression bomb."""
    from PIL import Image

    return 2 * int(Image.MAX_IMAGE_PIXELS or 89_478_485)


def _header_pixels(path: Path) -> int | None:
    """Width × height from the file's header (PIL's check off for this read only)."""
    from PIL import Image

    saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
    try:
        with Image.open(path) as im:
            return int(im.width) * int(im.height)
    except Exception:  # the header was readable a moment ago; the size is only for the message
        return None
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def _too_many_pixels(path: Path, pixels: int | None) -> IdentifiableError:
    size = f"{pixels / 1e6:.0f} megapixels" if pixels else "too many pixels"
    return IdentifiableError(
        f"--image {path} holds {size}, more than the {_max_pixels() / 1e6:.0f} megapixels "
        "that are read (a larger image may be a decompression bomb); resize it, e.g. to the "
        "model's image size"
    )


def _read_npy(path: Path) -> Any:
    import numpy as np
    import torch

    try:
        arr = np.load(path, allow_pickle=False, mmap_mode="r")  # the header first
    except (OSError, ValueError, EOFError) as exc:
        raise IdentifiableError(f"--image {path}: not a readable .npy array ({exc})") from None
    if arr.dtype.kind != "f" or arr.ndim not in (3, 4):
        raise IdentifiableError(
            f"--image {path}: a .npy image must hold float pixel values [C, H, W], "
            f"got {arr.dtype} {list(arr.shape)}"
        )
    if arr.shape[-1] * arr.shape[-2] > _max_pixels() or arr.size > 4 * _max_pixels():
        raise _too_many_pixels(path, int(arr.shape[-1]) * int(arr.shape[-2]))
    return torch.from_numpy(np.array(arr))


_TextArg = Annotated[
    str | None,
    typer.Argument(help="The text to look at (for an image model, give --image instead)."),
]

_ImageArg = Annotated[
    Path | None,
    typer.Option(
        "--image",
        help="For an image model (ViT, DeiT, CLIP's vision tower): the image file (PNG, "
        "JPEG; resized by the model's image processor) or pixel values [C, H, W] as .npy. "
        "The page shows the patch grid over the image.",
    ),
]

_OutArg = Annotated[Path, typer.Option("--out", "-o", help="The HTML file to write.")]

_LayerArg = Annotated[
    int, typer.Option("--layer", "-l", help="Layer shown first, 0..L-1 as printed.")
]

_HeadArg = Annotated[int, typer.Option("--head", help="Head shown first (0-based).")]

_RowsArg = Annotated[
    str | None,
    typer.Option(
        "--rows",
        help="Query rows to certify first (a witness each), e.g. 0,5,9; the first is "
        "shown on opening.",
    ),
]

_MaxRowsArg = Annotated[
    int, typer.Option("--max-rows", help="At most this many rows get a witness (an LP each).")
]

_IntervalSecondsArg = Annotated[
    float,
    typer.Option(
        "--interval-seconds",
        help="Time budget for the chosen head's interval bands and constrained attention; "
        "rows left when it runs out are skipped, keeping those done spread over the text.",
    ),
]

_CertifyArg = Annotated[
    bool,
    typer.Option(
        "--certify/--no-certify",
        help="Certify the chosen head: interval bands of every row (within "
        "--interval-seconds), identifiable weights and constrained attention.",
    ),
]

_IdentifiableBelowArg = Annotated[
    float,
    typer.Option(
        "--identifiable-below",
        help="Mark a weight identifiable when its interval is narrower than this.",
    ),
]

_VariantArg = Annotated[
    str, typer.Option("--variant", help="Effective attention: paper or row-stochastic.")
]

_MaxMbArg = Annotated[float, typer.Option("--max-mb", help="Page size limit in MB.")]

_MixingArg = Annotated[
    str | None,
    typer.Option(
        "--mixing",
        help="Context-mixing methods to offer in place of the attention maps, e.g. "
        "globenc,alti (see identifiable mixing).",
    ),
]


def view(
    text: _TextArg = None,
    image: _ImageArg = None,
    pair: PairOption = None,
    model: ModelOption = "minilm",
    out: _OutArg = Path("attention.html"),
    layer: _LayerArg = 0,
    head: _HeadArg = 0,
    rows: _RowsArg = None,
    max_rows: _MaxRowsArg = 16,
    interval_seconds: _IntervalSecondsArg = 30.0,
    certify: _CertifyArg = True,
    identifiable_below: _IdentifiableBelowArg = 0.01,
    variant: _VariantArg = "paper",
    max_mb: _MaxMbArg = 9.0,
    mixing: _MixingArg = None,
    force: ForceOption = False,
    memory_budget: MemoryBudgetOption = None,
) -> None:
    """Write a self-contained page: raw, effective and null attention per head; for the
    chosen head, interval bands of every row, identifiable weights and constrained attention.
    For an image model (--image), a patch grid over the image in place of the tokens."""
    from identifiable.store.files import atomic_write_text
    from identifiable.viewer.build import mixing_maps, viewer_html_for_trace

    _check_inputs(text, image, pair, out, force)
    options = _options(
        layer=layer,
        head=head,
        rows=rows,
        max_rows=max_rows,
        max_mb=max_mb,
        interval_seconds=interval_seconds,
        certify=certify,
        identifiable_below=identifiable_below,
        variant=variant,
        mixing=mixing,
        memory_budget=mib(memory_budget),
    )
    check_model_name(model)
    picture = None if image is None else _read_image(image)
    m = load(model, images=True)
    source: Any = picture if picture is not None else (text, pair) if pair is not None else text
    trace, picture_rgb = _trace(m, model, source, picture)
    if not 0 <= layer < trace.n_layers:
        # Layers are numbered from 0 on every surface, as `identifiable trace` prints them.
        raise IdentifiableError(
            f"--layer {layer} is out of range: valid layers are 0..{trace.n_layers - 1}"
        )
    from identifiable.utils.progress import status

    with status("computing effective attention" + (" and interval bands" if certify else "")):
        maps = mixing_maps(m, source, options.mixing)
        html = viewer_html_for_trace(trace, options, mixing=maps, image=picture_rgb)
    check_writable(out, "--out", force=force)  # a file made while we computed is not replaced
    atomic_write_text(out, html)
    console.print(f"wrote {out} ({len(html.encode()) / 1e6:.2f} MB, {trace.n_tokens} tokens)")


def _check_inputs(
    text: str | None, image: Path | None, pair: str | None, out: Path, force: bool
) -> None:
    """One text or one image, and an output file we may write: one line otherwise."""
    if text is not None and image is not None:
        raise IdentifiableError(
            "give either a TEXT (text models) or --image FILE (image models), not both"
        )
    if image is not None and pair is not None:
        raise IdentifiableError("--pair is for text models; an image is viewed alone")
    if image is None and text is None:
        raise IdentifiableError(
            "Missing argument 'TEXT': give the text to view, e.g. identifiable view "
            '"The cat sat.", or --image FILE for an image model'
        )
    if image is None and (text is None or not text.strip()):
        raise IdentifiableError(
            'the text is empty: give the sentence to view, e.g. identifiable view "The cat sat." '
            "(or --image FILE for an image model)"
        )
    if out.exists() and out.is_dir():
        raise IdentifiableError(f"--out {out} is a folder; give a file name such as attention.html")
    check_writable(out, "--out", force=force)


def _options(
    *,
    rows: str | None,
    max_mb: float,
    mixing: str | None,
    **given: Any,
) -> ViewerOptions:
    """The page's `ViewerOptions` from the flags, each checked with the flag's name before
    the model loads (an unknown --mixing method too)."""
    from identifiable.mixing import get_method
    from identifiable.viewer.page import ViewerOptions

    if given["max_rows"] < 1:
        raise IdentifiableError(f"--max-rows must be at least 1, got {given['max_rows']}")
    if not (math.isfinite(max_mb) and 1 <= max_mb <= MAX_PAGE_MB):
        raise IdentifiableError(
            f"--max-mb must be a number of MB between 1 and {MAX_PAGE_MB:.0f}, got {max_mb:g}"
        )
    seconds = given["interval_seconds"]
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_INTERVAL_S):
        raise IdentifiableError(
            f"--interval-seconds must be a number of seconds between 0 and "
            f"{MAX_INTERVAL_S:.0f} (11 days), got {seconds:g}"
        )
    if given["head"] < 0:
        raise IdentifiableError(f"--head must be 0 or more, got {given['head']}")
    below = given["identifiable_below"]
    if not (math.isfinite(below) and 0 < below < 1):
        raise IdentifiableError(
            "--identifiable-below must be an interval width between 0 and 1 (exclusive), "
            f"such as 0.01; got {below}"
        )
    methods = tuple(v.strip() for v in (mixing or "").split(",") if v.strip())
    for name in methods:  # an unknown method fails before the model loads
        get_method(name)
    chosen = tuple(index_list(rows, "--rows") or ())
    return ViewerOptions(rows=chosen, max_bytes=int(max_mb * 1e6), mixing=methods, **given)


def _trace(m: Any, model: str, source: Any, picture: Any) -> tuple[Any, Any]:
    """The trace of `source`, and the picture as the model saw it (image models), after
    checking that the input suits the model."""
    from identifiable.viewer.build import check_grid, image_rgb

    modality = getattr(m, "modality", "text")
    if picture is not None and modality != "image":
        raise IdentifiableError(
            f"'{model}' is a text model ({m.spec.name}): give the TEXT to view, not --image"
        )
    if picture is None and modality == "image":
        raise IdentifiableError(
            f"'{model}' is an image model ({m.spec.name}): give --image FILE, not text"
        )
    if picture is None:
        check_reads_text(m, model)
    if picture is not None and not _is_tensor(picture) and m.image_processor is None:
        raise IdentifiableError(
            f"'{model}' has no image processor saved beside its weights "
            "(preprocessor_config.json): save one there, or give pixel values [C, H, W] "
            "as --image FILE.npy"
        )
    trace = m.trace(source)
    picture_rgb = None
    if picture is not None:
        check_grid(m, trace.tokens)
        picture_rgb = image_rgb(m, picture)
    return trace, picture_rgb


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def register(app: typer.Typer) -> None:
    app.command()(view)
