"""Progress everywhere: every helper of identifiable.utils.progress writes plain lines where nobody
watches (stderr is not a terminal: a log), and rich bars where a person does; long CLI
commands show it through the real entry point (pytest's captured stderr is a log)."""

from __future__ import annotations

import time

import pytest

from helpers.cli import run_main
from helpers.families import build_tiny_hf_model
from identifiable.utils import progress

TEXT = "the cat sat on the mat while the dog slept"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, bert_tokenizer):
    folder = tmp_path_factory.mktemp("tiny-bert")
    build_tiny_hf_model("bert").save_pretrained(folder)
    bert_tokenizer.save_pretrained(folder)
    return folder


def test_the_helpers_write_lines_in_a_log(capsys, monkeypatch) -> None:
    with progress.task_bar("fitting probes", 3) as bar:
        for _ in range(3):
            bar.advance()
    assert list(progress.track(range(4), "tracing")) == [0, 1, 2, 3]
    with progress.status("tokenising corpus 'x' …"):
        pass
    monkeypatch.setattr(progress, "STATUS_START_LINE_S", 0.01)
    with progress.status("a long step"):
        time.sleep(0.3)  # still running after the delay: its start line too
    gen = (x for x in range(2))  # no length: the last line still says how many
    assert list(progress.track(gen, "texts")) == [0, 1]
    err = capsys.readouterr().err.splitlines()
    assert "fitting probes: 3/3 (100%)" in "\n".join(err)
    assert any(line.startswith("tracing: 4/4 (100%)") for line in err)
    assert "tokenising corpus 'x' …" not in err  # done at once: no start line
    assert any(line.startswith("tokenising corpus 'x': done in") for line in err)
    assert err.index("a long step …") < next(
        i for i, x in enumerate(err) if x.startswith("a long step: done in")
    )
    assert any(line.startswith("texts: 2/2 (100%)") for line in err)
    # disabled: nothing at all
    with progress.task_bar("quiet", 2, enabled=False) as bar:
        bar.advance(2)
    list(progress.track(range(3), "quiet", enabled=False))
    with progress.status("quiet", enabled=False):
        pass
    assert capsys.readouterr().err == ""


def test_a_person_watching_gets_bars_not_lines(capsys, monkeypatch) -> None:
    monkeypatch.setattr(progress, "watching", lambda: True)
    with progress.task_bar("fitting probes", 3) as bar:
        bar.advance(3)
    list(progress.track(range(4), "tracing"))
    err = capsys.readouterr().err
    assert "(100%)" not in err and "done in" not in err  # rich draws (transient) bars


def test_trace_many_shows_progress_only_when_asked_or_watched(tiny_model, capsys, monkeypatch):
    model = tiny_model("bert")
    list(model.trace_many([TEXT, "a second text"]))
    assert capsys.readouterr().err == ""  # a script's log: silent by default
    list(model.trace_many([TEXT, "a second text"], progress=True))
    assert "tracing: 2/2 (100%)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["certify", TEXT, "--layer", "1", "--head", "0"], "attention intervals (rows): "),
        (["mixing", TEXT, "--method", "rollout"], "context mixing (rollout)"),
    ],
)
def test_long_commands_write_their_steps_to_a_log(model_dir, capsys, args, line) -> None:
    rc, out, err = run_main([*args, "--model", str(model_dir)], capsys)
    assert rc == 0, err
    lines = [x for x in err.splitlines() if x.startswith(line)]
    if "rows" in line:  # counted: the last line is the whole head's rows (12 tokens)
        assert lines and lines[-1].startswith(f"{line}12/12 (100%)"), err
    else:  # a step without a count: its time when it ends
        assert lines and ": done in" in lines[-1], err
    assert line not in out  # progress never goes to stdout


def test_view_writes_its_steps_to_a_log(model_dir, capsys, tmp_path) -> None:
    out_file = tmp_path / "v.html"
    rc, _, err = run_main(
        ["view", TEXT, "--model", str(model_dir), "--out", str(out_file), "--no-certify"], capsys
    )
    assert rc == 0, err
    assert any(x.startswith("computing effective attention: done in") for x in err.splitlines())
    assert out_file.is_file()
