"""`identifiable attribution`, run as the user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "identifiable", "attribution", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.integration
def test_attribution_estimate_with_json(tmp_path):
    out = tmp_path / "a.json"
    r = run_cli("Paris is nice.", "--probes", "4", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "median own" in r.stdout and "4 probes" in r.stdout
    data = json.loads(out.read_text())
    assert data["tokens"] == ["[CLS]", "paris", "is", "nice", ".", "[SEP]"]
    assert len(data["layers"]) == 6 and data["n_jvps"] == 24
    c = data["contributions"]
    assert all(abs(sum(row) - 1) < 1e-9 for layer in c for row in layer)
    layer1 = data["layers"][0]
    assert layer1["median_own_contribution"] == pytest.approx(
        sorted(t["own"] for t in layer1["tokens"])[2], abs=0.5
    )
    assert data["stderr"] is not None
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["Paris is nice.", "--probes", "0"],
            "probes must be between 1 and the model width d = 384",
        ),
        ([" ".join(["word"] * 400), "--memory-budget", "64"], "--probes"),
        (
            ["Paris is nice.", "--time-budget", "0.0001"],
            "more than the time budget of 0.0001 s: raise --time-budget or pass fewer probes",
        ),
        (["Paris is nice.", "--time-budget", "0"], "--time-budget"),
    ],
)
def test_attribution_bad_input(args, message, capsys):
    """In-process through the CLI's own entry point (a subprocess per case is slow)."""
    from identifiable.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["attribution", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
