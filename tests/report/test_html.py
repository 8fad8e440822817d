"""The HTML builder escapes by construction and pages allow only their own script."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re

import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from identifiable.report.html import Markup, data_script, esc, h, json_for_script, page, table_html

NASTY = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "</script><script>alert(2)</script>",
    "a&b",
    "\u2028\u2029",
]


def test_text_children_and_attributes_are_escaped() -> None:
    out = h("p", NASTY[0], title=NASTY[1])
    assert "<script>" not in out and "<img" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert 'title="&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"' in out


def test_markup_is_not_escaped_twice() -> None:
    inner = h("b", "x<y")
    out = h("p", inner, "&")
    assert out == "<p><b>x&lt;y</b>&amp;</p>"
    assert isinstance(out, Markup)


def test_attribute_name_mapping_and_booleans() -> None:
    assert (
        h("input", class_="c", data_row=3, disabled=True, hidden=None)
        == '<input class="c" data-row="3" disabled>'
    )


@given(st.lists(st.text(), max_size=5))
def test_json_for_script_cannot_close_the_element_and_round_trips(texts: list[str]) -> None:
    encoded = json_for_script({"tokens": [*texts, *NASTY]})
    assert "<" not in encoded and ">" not in encoded and "&" not in encoded
    assert "\u2028" not in encoded and "\u2029" not in encoded
    assert json.loads(encoded) == {"tokens": [*texts, *NASTY]}


def test_data_script_is_inert_json() -> None:
    out = data_script("d", {"t": NASTY})
    assert out.startswith('<script type="application/json" id="d">')
    assert out.count("</script>") == 1


def test_table_cells_are_escaped() -> None:
    df = pd.DataFrame({"token": NASTY[:2], "x": [0.5, 1.25]})
    out = table_html(df)
    assert "<script>" not in out and "<img" not in out
    assert "0.500" in out and "1.250" in out


def test_page_csp_allows_exactly_its_own_script() -> None:
    doc = page("t<", h("p", "x"), styles=["base.css"], scripts=["viewer.js"])
    csp = html.unescape(
        re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', doc).group(1)
    )
    code = re.search(r"<script>(.*)</script>", doc, re.S).group(1)
    digest = base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp
    assert "default-src 'none'" in csp and "connect-src 'none'" in csp
    assert "<title>t&lt;</title>" in doc
    assert esc("<") == "&lt;"
