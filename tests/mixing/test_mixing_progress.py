"""context_mixing shows a status line while it computes (issue 25, progress everywhere):
on when asked or when a person watches, off when asked (the CLI and the experiments draw
their own), and one plain line in a log once it has run for 3 s."""

from __future__ import annotations

import contextlib

import pytest

from identifiable.mixing import api


@pytest.mark.parametrize(("progress", "watched", "shown"), [
    (True, False, True), (False, True, False), (None, True, True), (None, False, False),
])  # fmt: skip
def test_status_follows_the_argument_and_the_watcher(
    tiny_model, monkeypatch, progress, watched, shown
):
    seen: list[tuple[str, bool]] = []

    def spy(text: str, *, enabled: bool = True):
        seen.append((text, enabled))
        return contextlib.nullcontext()

    monkeypatch.setattr(api, "status", spy)
    monkeypatch.setattr(api, "watching", lambda: watched)
    res = api.context_mixing(tiny_model("bert"), "a few words", "rollout", progress=progress)
    assert res.layerwise.shape[0] == 2
    assert seen == [("context mixing by rollout …", shown)]


def test_a_slow_computation_writes_one_line_in_a_log(tiny_model, monkeypatch, capsys):
    import time

    from identifiable.utils import progress

    monkeypatch.setattr(progress, "watching", lambda: False)
    slow = api.METHODS["rollout"]
    monkeypatch.setitem(
        api.METHODS,
        "rollout",
        api.Method(
            slow.name, slow.summary, lambda x, o: (time.sleep(3.5), slow.compute(x, o))[1],
            slow.defaults, slow.needs_blocks,
        ),
    )  # fmt: skip
    api.context_mixing(tiny_model("bert"), "a few words", "rollout", progress=True)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines and all("context mixing by rollout" in ln for ln in lines), lines
