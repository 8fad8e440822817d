"""`identifiable models` and `identifiable trace`, run as the user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "identifiable", *args], capture_output=True, text=True, timeout=300
    )


def test_models_lists_architectures():
    r = run_cli("models")
    assert r.returncode == 0, r.stderr
    for name in ("bert", "roberta", "distilbert", "electra", "gpt2", "llama", "minilm"):
        assert name in r.stdout


@pytest.mark.integration
def test_trace_embedded_model(tmp_path):
    out = tmp_path / "t.json"
    r = run_cli("trace", "The cat sat on the mat.", "--pair", "It was happy.", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "self-check: passed" in r.stdout
    data = json.loads(out.read_text())
    assert data["tokens"][0] == "[CLS]" and data["tokens"].count("[SEP]") == 2
    assert len(data["reconstruction_error"]) == 6 and max(data["reconstruction_error"]) < 1e-4
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["trace", "   "], "text is empty"),
        (["trace", "hello", "--model", "./missing-dir"], "does not exist"),
        (["trace", "word " * 600, "--no-truncate"], "takes at most 512"),
    ],
)
def test_trace_bad_input_is_one_line(args, message):
    r = run_cli(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0


def test_trace_truncation_warns():
    r = run_cli("trace", "word " * 600)
    assert r.returncode == 0, r.stderr
    assert "warning: text has 602 tokens; dropped 90" in r.stderr
