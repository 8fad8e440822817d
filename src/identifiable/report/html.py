"""A tiny HTML builder that escapes by construction.

Every piece of text is escaped unless it is already `Markup` (built by `h`,
`raw` or the helpers here), so a token such as `<script>alert(1)</script>` can
only ever appear as text. Data for scripts goes through `json_for_script`, which
escapes `<`, `>`, `&` and U+2028/U+2029 so nothing inside a `<script>` element
can close it. Pages are self-contained: CSS and JS come from `assets/` and are
inlined, images are inlined as base64 data URIs; nothing is fetched.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from collections.abc import Iterable
from functools import cache
from importlib import resources
from typing import Any

import pandas as pd

# Elements that have no closing tag.
_VOID = frozenset({"br", "hr", "img", "input", "meta", "link", "col", "wbr"})


class Markup(str):
    """A string that is already safe HTML; never escaped again."""

    __slots__ = ()


def esc(text: object) -> Markup:
    """Escape text for HTML element content and attribute values (quotes too)."""
    return Markup(html.escape(str(text), quote=True))


def raw(markup: str) -> Markup:
    """Mark trusted, package-authored HTML as safe. Never pass user text here."""
    return Markup(markup)


def _render(child: Any) -> str:
    if child is None or child is False:
        return ""
    if isinstance(child, Markup):
        return child
    if isinstance(child, str | int | float):
        return esc(child)
    if isinstance(child, Iterable):
        return "".join(_render(c) for c in child)
    return esc(child)


def h(tag: str, *children: Any, **attrs: Any) -> Markup:
    """Build one element. `class_`/`for_` map to `class`/`for`; `data_x` to `data-x`.

    Attribute values are escaped; `True` renders a bare attribute, `None`/`False` omits it.
    """
    parts = [tag]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        name = key.rstrip("_").replace("_", "-")
        parts.append(name if value is True else f'{name}="{esc(value)}"')
    opening = "<" + " ".join(parts) + ">"
    if tag in _VOID:
        return Markup(opening)
    return Markup(f"{opening}{_render(children)}</{tag}>")


def json_for_script(obj: Any) -> Markup:
    """JSON that is safe inside `<script type="application/json">` (no `</script>` breakout)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for ch, repl in (
        ("&", "\\u0026"),
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(ch, repl)
    return Markup(text)


def data_script(element_id: str, obj: Any) -> Markup:
    """An inert JSON data island that page scripts read with `JSON.parse(textContent)`."""
    return Markup(
        f'<script type="application/json" id="{esc(element_id)}">{json_for_script(obj)}</script>'
    )


# A stylesheet line `/* include NAME.css */` stands for that asset's text: the colours the
# report and the viewer share live in palette.css once, and each page still inlines them.
_INCLUDE = re.compile(r"^[ \t]*/\* include ([\w.-]+\.css) \*/\n", re.MULTILINE)


@cache
def asset(name: str) -> str:
    """Text of a file shipped in `identifiable/report/assets/`, its includes inlined."""
    text = (
        resources.files("identifiable.report").joinpath("assets").joinpath(name).read_text("utf-8")
    )
    return _INCLUDE.sub(lambda m: asset(m.group(1)), text) if name.endswith(".css") else text


def inline_style(*names: str) -> Markup:
    return Markup("<style>\n" + "\n".join(asset(n) for n in names) + "\n</style>")


def script_code(names: Iterable[str]) -> str:
    """The text of our own script assets, joined, checked to hold no closing script tag."""
    code = "\n" + "\n".join(asset(n) for n in names) + "\n"
    # Our own assets; still guard against an accidental closing tag in them.
    if "</script" in code.lower():
        raise ValueError("asset script contains '</script'")
    return code


def png_img(png: bytes, alt: str, **attrs: Any) -> Markup:
    """An `<img>` with the PNG inlined as a base64 data URI."""
    src = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return h("img", src=src, alt=alt, **attrs)


def table_html(
    df: pd.DataFrame, *, max_rows: int = 30, digits: int = 3, caption: str = ""
) -> Markup:
    """A small HTML table (first `max_rows` rows), every cell escaped."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.{digits}f}"
        return str(v)

    head = h("tr", [h("th", str(c)) for c in df.columns])
    rows = [
        h("tr", [h("td", cell(v)) for v in row])
        for row in df.head(max_rows).itertuples(index=False)
    ]
    more = (
        h("p", f"… {len(df) - max_rows} more rows in the CSV/Parquet file.", class_="note")
        if len(df) > max_rows
        else None
    )
    return Markup(
        h("table", h("caption", caption) if caption else None, head, rows) + _render(more)
    )


def page(
    title: str,
    body: Any,
    *,
    styles: Iterable[str] = (),
    scripts: Iterable[str] = (),
) -> str:
    """A complete self-contained HTML document.

    The Content-Security-Policy forbids every network fetch and allows only our
    own inline script, by its SHA-256 hash: an injected `<script>` or `onerror=`
    would not run even if escaping failed (escaping is still the first defence,
    and the tests check both). A mistake that would load something from outside
    fails loudly in the browser tests instead of silently needing the network.
    """
    code = script_code(scripts) if scripts else ""
    digest = base64.b64encode(hashlib.sha256(code.encode("utf-8")).digest()).decode("ascii")
    csp = (
        "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
        f"script-src 'sha256-{digest}'; connect-src 'none'; base-uri 'none'; form-action 'none'"
    )
    doc = h(
        "html",
        h(
            "head",
            raw('<meta charset="utf-8">'),
            h("meta", http_equiv="Content-Security-Policy", content=csp),
            h("meta", name="viewport", content="width=device-width, initial-scale=1"),
            h("title", title),
            inline_style(*styles) if styles else None,
        ),
        h("body", body, raw(f"<script>{code}</script>") if code else None),
        lang="en",
    )
    return "<!DOCTYPE html>\n" + doc + "\n"
