"""How a result shows itself: a one-line `repr` (never the tensors) and a compact, escaped
HTML summary for Jupyter (`identifiable.results.html` draws its pieces)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from identifiable.results.core import ResultCore

HTML_TOKENS = 64
# arrays larger than this are summarised by shape and dtype only (min/max would cost a pass)
HTML_STATS_LIMIT = 5_000_000


class Display(ResultCore):
    """`repr` and `_repr_html_` of every result."""

    def __repr__(self) -> str:
        parts: list[str] = []
        if self._model:
            parts.append(f"model={self._model!r}")
        n = self._n()
        if n is not None:
            parts.append(f"n_tokens={n}")
        for attr in self._summary:
            parts.append(f"{attr}={getattr(self, attr, None)!r}")
        for name in self._present():
            parts.append(f"{name}: {_shape_text(self._raw_value(name), self._dims[name])}")
        for name, _ in self._tables.items():
            table = getattr(self, name, None)
            if table is not None:
                parts.append(f"{name}: table[{len(table)} rows × {len(table.columns)} columns]")
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, ResultCore):  # a nested result
                parts.append(f"{f.name}={type(value).__name__}(…)")
        return f"{type(self).__name__}({', '.join(parts)})"

    def _repr_html_(self) -> str:
        """A headline, a small inline SVG picture and the arrays' table, for Jupyter (every
        piece of text escaped; no tensors, no script): `identifiable.results.html`."""
        from markupsafe import Markup, escape

        from identifiable.results import html as result_html

        head = [Markup("<b>{}</b>").format(type(self).__name__)]
        if self._model:
            head.append(Markup("model <code>{}</code>").format(self._model))
        n = self._n()
        if n is not None:
            head.append(Markup("n = {} tokens").format(n))
        for attr in self._summary:
            head.append(Markup("{} = <code>{}</code>").format(attr, getattr(self, attr, None)))
        rows = []
        for name in self._present():
            value = self._raw_value(name)
            dims = self._dims[name]
            shape = ", ".join(f"{d}={s}" for d, s in zip(dims, value.shape, strict=False))
            lo, hi = _min_max(name, value)
            rows.append(
                Markup(
                    "<tr><td><code>{}</code></td><td>[{}]</td><td>{}</td>"
                    "<td>{}</td><td>{}</td></tr>"
                ).format(name, shape, _dtype_name(value), lo, hi)
            )
        for name in self._tables:
            table = getattr(self, name, None)
            if table is None:
                continue
            rows.append(
                Markup(
                    "<tr><td><code>{}</code></td><td>{} rows</td><td>table</td>"
                    "<td colspan=2>{}</td></tr>"
                ).format(name, len(table), ", ".join(map(str, table.columns)))
            )
        table_html = Markup("")
        if rows:
            table_html = (
                Markup(
                    '<table class="idf-result-table"><thead><tr><th>array</th>'
                    "<th>dimensions</th><th>dtype</th><th>min</th><th>max</th></tr>"
                    "</thead><tbody>"
                )
                + Markup("").join(rows)
                + Markup("</tbody></table>")
            )
        tokens_html = Markup("")
        tokens = self._tokens
        if tokens:
            shown = tokens[:HTML_TOKENS]
            more = len(tokens) - len(shown)
            spans = Markup(" ").join(Markup("<code>{}</code>").format(t) for t in shown)
            tail = Markup(" … ({} more)").format(more) if more > 0 else Markup("")
            tokens_html = Markup("<div><small>tokens: {}{}</small></div>").format(spans, tail)
        return str(
            Markup('<div class="idf-result">{}{}{}{}{}</div>').format(
                escape(" · ").join(head) if head else "",
                result_html.headline_html(self),
                result_html.picture(self),
                table_html,
                tokens_html,
            )
        )


def _dtype_name(value: Any) -> str:
    return str(getattr(value, "dtype", type(value).__name__)).removeprefix("torch.")


def _shape_text(value: Any, dims: Sequence[str]) -> str:
    shape = getattr(value, "shape", ())
    inner = ", ".join(f"{d}={s}" for d, s in zip(dims, shape, strict=False))
    return f"{_dtype_name(value)}[{inner}]"


def _min_max(name: str, value: Any) -> tuple[str, str]:
    """min and max as text; "—" where they mean nothing (token ids, masks) or cost a pass
    over a very large array."""
    from identifiable.results.html import stats

    if getattr(value, "numel", lambda: getattr(value, "size", 0))() > HTML_STATS_LIMIT:
        return "—", "—"
    got = stats(name, value)
    return got if got is not None else ("—", "—")
