"""One `ViewerOptions` for every viewer entry point: keyword calls and an options object
build the same page, byte for byte, and a changed option changes it."""

from __future__ import annotations

import dataclasses

import pytest

from identifiable.errors import IdentifiableError
from identifiable.viewer.options import ViewerOptions, ViewerPage
from identifiable.viewer.page import read_viewer_data, viewer_html
from viewer.test_viewer_browser import synthetic_args


def _data_fields() -> dict:
    args = synthetic_args()
    names = {f.name for f in dataclasses.fields(ViewerPage)}
    return {k: v for k, v in args.items() if k in names}


def test_keywords_and_an_options_object_give_the_same_page() -> None:
    data = _data_fields()
    by_keywords = viewer_html(**data, layer=2, head=1, row=3, variant="row-stochastic")
    options = ViewerOptions(layer=2, head=1, rows=(3, 7), variant="row-stochastic")
    by_object = viewer_html(ViewerPage(**data, options=options))
    assert by_object == by_keywords
    (island,) = read_viewer_data(by_object)
    assert island["start"] == [2, 1] and island["start_row"] == 3
    assert island["variant"] == "row-stochastic"


def test_an_option_reaches_the_page() -> None:
    data = _data_fields()
    (a,) = read_viewer_data(viewer_html(ViewerPage(**data)))
    (b,) = read_viewer_data(viewer_html(ViewerPage(**data, options=ViewerOptions(head=3))))
    assert a["start"] == [0, 0] and b["start"] == [0, 3]


def test_options_of_normalises_sequences_and_row() -> None:
    o = ViewerOptions.of(None, {"rows": [4, 5], "mixing": ["rollout"]})
    assert o.rows == (4, 5) and o.mixing == ("rollout",)
    assert ViewerOptions.of(o, {"row": None}).rows == ()
    assert ViewerOptions.of(None, {"row": 2}).rows == (2,)
    with pytest.raises(IdentifiableError, match="unknown viewer option no_such_option="):
        ViewerOptions.of(None, {"no_such_option": 1})
