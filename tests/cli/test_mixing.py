"""`identifiable mixing`: output, JSON, and usage errors through the real entry point."""

from __future__ import annotations

import json

import pytest

import identifiable.cli.mixing as cli_mixing
from identifiable.cli import main
from identifiable.mixing import method_names

TEXT = "the cat sat on the mat"


def run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["mixing", *args])
        raise SystemExit(0)
    out = capsys.readouterr()
    return int(exit_info.value.code or 0), out.out, out.err


def test_json_holds_both_maps(capsys, monkeypatch, tiny_model, tmp_path):
    monkeypatch.setattr(cli_mixing, "load", lambda name: tiny_model("bert"))
    path = tmp_path / "m.json"
    code, out, err = run(capsys, TEXT, "--method", "alti", "--json", str(path))
    assert code == 0, err
    assert "alti (rolled out)" in out
    data = json.loads(path.read_text())
    n = len(data["tokens"])
    assert data["method"] == "alti" and data["layers"] == [1, 2]
    assert len(data["rolled"]) == 2 and len(data["rolled"][0]) == n
    assert abs(sum(data["rolled"][1][0]) - 1) < 1e-9
    assert not list(tmp_path.glob(".*tmp"))


def test_options_reach_the_method(capsys, monkeypatch, tiny_model, tmp_path):
    monkeypatch.setattr(cli_mixing, "load", lambda name: tiny_model("bert"))
    path = tmp_path / "g.json"
    code, _, err = run(
        capsys, TEXT, "--method", "globenc", "--first-norm-only", "--json", str(path)
    )
    assert code == 0, err
    assert json.loads(path.read_text())["options"]["second_norm"] is False


def test_unknown_method_lists_the_known_ones(capsys):
    code, out, err = run(capsys, TEXT, "--method", "saliency")
    assert code == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and line.startswith("error: unknown mixing method 'saliency'")
    assert all(name in line for name in method_names())


def test_option_of_another_method_is_refused(capsys):
    code, _, err = run(capsys, TEXT, "--method", "rollout", "--probes", "4")
    assert code == 2 and err.strip() == "error: --probes does not apply to --method rollout"


@pytest.mark.parametrize("bad", ["nan", "0", "-2"])
def test_flow_budget_must_be_positive_before_loading(capsys, monkeypatch, bad):
    def never(name):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(cli_mixing, "load", never)
    code, _, err = run(capsys, TEXT, "--method", "flow", "--flow-budget", bad)
    assert code == 2 and "\n" not in err.strip()
    assert err.strip().endswith("must be a positive number of seconds") and "--flow-budget" in err


def test_unwritable_json_fails_before_any_work(capsys, monkeypatch, tmp_path):
    def never(name):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(cli_mixing, "load", never)
    code, _, err = run(capsys, TEXT, "--json", str(tmp_path / "missing" / "x.json"))
    assert code == 2 and "does not exist" in err and "\n" not in err.strip()


def test_pre_ln_second_norm_is_one_line(capsys, monkeypatch, tiny_model, tmp_path):
    monkeypatch.setattr(cli_mixing, "load", lambda name: tiny_model("gpt2"))
    path = tmp_path / "x.json"
    code, _, err = run(capsys, TEXT, "--method", "globenc", "--second-norm", "--json", str(path))
    assert code == 2 and "undefined for the pre-norm 'gpt2'" in err
    assert "\n" not in err.strip() and not path.exists()


@pytest.mark.integration
def test_flow_on_a_long_text_names_the_limit(capsys, tmp_path):
    long = " ".join(["The river flows past the old mill and into the sea."] * 20)
    path = tmp_path / "f.json"
    code, _, err = run(capsys, long, "--method", "flow", "--json", str(path))
    line = err.strip().splitlines()[-1]
    assert code == 2 and line.startswith("error: flow on ")
    assert "about" in line and "tokens for this 6-layer model" in line
    assert "--flow-budget" in line and not path.exists()
