"""`identifiable scan` through the real entry point: its files, its refusals (one line, exit
status 2, nothing written), and an interrupted scan that resumes without losing a shard."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.cli import Outcome, assert_refused, run_main, snapshot
from identifiable.attention import ScanResult
from identifiable.attention.scan import STATISTICS

TEXTS = [
    "the cat sat on the mat and the dog sat on the log while the bird flew over the tree",
    "a second text, a little shorter",
    "and a third one about rivers, cities and the music of trains",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, bert_tokenizer) -> Path:
    from helpers.families import build_tiny_hf_model

    root = tmp_path_factory.mktemp("scan-cli") / "tiny-llama"
    build_tiny_hf_model("llama", attn_implementation="sdpa").save_pretrained(root)
    bert_tokenizer.save_pretrained(root)
    return root


def scan(args: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    return Outcome(*run_main(["scan", *args, "--no-progress"], capsys))


def test_scan_writes_its_result_table_and_summary(model_dir, tmp_path, capsys):
    out = tmp_path / "scan"
    done = scan([*TEXTS, "--model", str(model_dir), "--out", str(out), "--keep", "1:2"], capsys)
    assert done.code == 0, done.err
    assert "null fraction" in done.out and "written:" in done.out
    result = ScanResult.load(out / "scan.safetensors")
    assert result.n_texts == 3 and result.kept == ((0, 1, 2), (1, 1, 2), (2, 1, 2))
    header = (out / "heads.csv").read_text("utf-8").splitlines()[0]
    assert header == ",".join(["text", "layer", "head", *STATISTICS])
    assert '"mean_null_fraction"' in (out / "summary.json").read_text("utf-8")
    again = scan([*TEXTS, "--model", str(model_dir), "--out", str(out)], capsys)
    assert_refused(again, "--force")


@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        (["--sink", "99"], "--sink 99 is out of range"),
        (["--sink", "-1"], "--sink -1 is out of range"),
        (["--keep", "5:0"], "--keep names 5:0, but layer 5 is not scanned"),
        (["--heads", "0,1", "--keep", "1:3"], "head 3 is not scanned"),
        (["--keep", "1-2"], "--keep takes LAYER:HEAD pairs"),
        (["--device", "cuda"], "device 'cuda' is not available"),
        (["--memory-budget", "1"], "--memory-budget"),
        (["--layers", "7"], "--layers 7 is out of range"),
        (["--variant", "other"], "unknown variant"),
    ],
)
def test_refusals_are_one_line_and_write_nothing(model_dir, tmp_path, capsys, extra, expect):
    out = tmp_path / "scan"
    before = snapshot(tmp_path)
    refused = scan([*TEXTS, "--model", str(model_dir), "--out", str(out), *extra], capsys)
    assert_refused(refused, expect)
    assert snapshot(tmp_path) == before


def test_a_request_that_will_not_fit_is_refused_before_the_forward_pass(
    model_dir, tmp_path, capsys, monkeypatch
):
    import identifiable.models.layerscan as layerscan

    def never(*args, **kwargs):
        raise AssertionError("the model ran")

    monkeypatch.setattr(layerscan, "scan_layers", never)
    refused = scan([*TEXTS, "--model", str(model_dir), "--out", str(tmp_path / "s"),
                    "--memory-budget", "1"], capsys)  # fmt: skip
    assert_refused(refused, "scan (3 texts, up to")
    assert "keep fewer maps (--keep)" in refused.err and "memory_budget=" not in refused.err


def test_an_interrupted_scan_resumes_and_loses_nothing(model_dir, tmp_path, capsys, monkeypatch):
    """Three shards (one text each); the run stops in the second. --resume computes only
    the texts not finished and writes the same result as an uninterrupted run."""
    import identifiable.attention.scan as scan_mod
    import identifiable.experiments.scan as stage

    monkeypatch.setattr(stage, "SHARD_TEXTS", 1)
    args = [*TEXTS, "--model", str(model_dir), "--keep", "0:1"]
    whole = scan([*args, "--out", str(tmp_path / "whole")], capsys)
    assert whole.code == 0, whole.err
    real, seen = scan_mod.scan_text, []

    def interrupted(model, enc, scanner, weights):
        seen.append(len(enc))
        if len(seen) == 2:
            raise KeyboardInterrupt
        return real(model, enc, scanner, weights)

    monkeypatch.setattr(stage, "scan_text", interrupted)
    out = tmp_path / "resumed"
    stopped = scan([*args, "--out", str(out)], capsys)
    assert stopped.code == 130 and "--resume" in stopped.err
    assert not out.exists()
    monkeypatch.setattr(stage, "scan_text", lambda *a: (seen.append(0), real(*a))[1])
    seen.clear()
    resumed = scan([*args, "--out", str(out), "--resume"], capsys)
    assert resumed.code == 0, resumed.err
    assert len(seen) == 2  # the first text's shard was not computed again
    a = ScanResult.load(out / "scan.safetensors")
    b = ScanResult.load(tmp_path / "whole" / "scan.safetensors")
    for name in (*STATISTICS, "kept_raw", "kept_effective"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=0, rtol=0,
                                   equal_nan=True, msg=name)  # fmt: skip
    assert (out / "heads.csv").read_bytes() == (tmp_path / "whole" / "heads.csv").read_bytes()


def test_texts_or_a_corpus_not_both(model_dir, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", "utf-8")
    both = scan(["a text", "--corpus", str(corpus), "--model", str(model_dir)], capsys)
    assert_refused(both, "not both")
    done = scan(["--corpus", str(corpus), "--unit", "document", "--limit", "2", "--model",
                 str(model_dir), "--out", str(tmp_path / "o")], capsys)  # fmt: skip
    assert done.code == 0, done.err
    assert ScanResult.load(tmp_path / "o" / "scan.safetensors").n_texts == 2
