"""`identifiable compare`: side by side on the same texts, aligned by relative depth."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from helpers.cli import run_main
from helpers.corpora import save_tiny_model, word_paragraphs
from helpers.families import build_tiny_hf_model, tiny_config
from identifiable.experiments.compare import differences


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    return word_paragraphs(path, seed=1, paragraphs=12, sentences=5, words=(6, 12), vocabulary=10)


@pytest.fixture(scope="module")
def models(tmp_path_factory, bert_tokenizer) -> tuple[Path, Path]:
    from transformers import AutoModel

    a = save_tiny_model(tmp_path_factory.mktemp("two-layers"), "bert", bert_tokenizer)
    cfg = tiny_config("bert")
    cfg.num_hidden_layers = 3
    torch.manual_seed(1)
    b = tmp_path_factory.mktemp("three-layers")
    AutoModel.from_config(cfg, attn_implementation="eager").save_pretrained(b)
    bert_tokenizer.save_pretrained(b)
    return a, b


def test_two_models_of_different_depth_side_by_side(tmp_path, models, corpus, capsys) -> None:
    out = tmp_path / "cmp"
    rc, stdout, err = run_main(
        [
            "compare",
            str(models[0]),
            str(models[1]),
            "--corpus",
            str(corpus),
            "--budget",
            "smoke",
            "--out",
            str(out),
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 0, err
    # smoke is a pipeline check: compare calls no claim different between such runs
    assert "pipeline check, not evidence" in stdout and "claims differ" not in stdout
    labels = [p.name for p in sorted((out / "models").iterdir())]
    assert len(labels) == 2 and all((out / "models" / x / "index.html").is_file() for x in labels)
    curves = pd.read_csv(out / "tables" / "curves.csv")
    depth = curves.groupby("model")["relative_depth"].max()
    assert (depth == 1.0).all()  # the last layer of each model sits at relative depth 1
    assert sorted(curves.groupby("model")["layer"].max()) == [1, 2]  # numbered from 0
    diff = pd.read_csv(out / "tables" / "differences.csv")
    assert set(diff["layer"]) == {0, 1, 2} and diff["difference"].notna().all()
    verdicts = pd.read_csv(out / "tables" / "verdicts.csv")
    assert len(verdicts) >= 5 and not verdicts["differs"].any()
    counts = pd.read_csv(out / "tables" / "token_counts.csv")
    assert counts["texts"].nunique() == 1  # the same texts for every model
    page = (out / "index.html").read_text()
    assert "Differences from" in page and "token" in page and "not evidence" in page
    summaries = [json.loads((out / "models" / x / "summary.json").read_text()) for x in labels]
    assert (
        summaries[0]["settings"]["corpus"]["fingerprint"]
        == summaries[1]["settings"]["corpus"]["fingerprint"]
    )


def test_differences_match_the_nearest_relative_depth() -> None:
    curve = pd.DataFrame(
        {
            "model": ["a"] * 2 + ["b"] * 4,
            "metric": ["m"] * 6,
            "layer": [1, 2, 1, 2, 3, 4],
            "relative_depth": [0.5, 1.0, 0.25, 0.5, 0.75, 1.0],
            "value": [1.0, 2.0, 10.0, 20.0, 30.0, 40.0],
        }
    )
    d = differences(curve, "a")
    assert list(d["reference_layer"]) == [1, 1, 1, 2]  # 0.75 is as near 0.5 as 1.0: the first
    assert list(d["difference"]) == [9.0, 19.0, 29.0, 38.0]


@pytest.mark.parametrize(
    ("arch", "expected"),
    # a folder without tokenizer files is refused at load; an image model reads no text
    [("bert", "has no tokenizer, so it cannot read text"), ("vit", "cannot align texts")],
)
def test_texts_that_cannot_be_aligned_are_refused(
    tmp_path, models, corpus, capsys, arch, expected
) -> None:
    bare = tmp_path / "no-tokenizer"
    build_tiny_hf_model(arch).save_pretrained(bare)
    capsys.readouterr()
    rc, _, err = run_main(
        [
            "compare",
            str(models[0]),
            str(bare),
            "--corpus",
            str(corpus),
            "--budget",
            "smoke",
            "--out",
            str(tmp_path / "o"),
        ],
        capsys,
    )
    assert rc == 2 and err.count("\n") == 1 and expected in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("case", ["one model", "foreign folder"])
def test_usage_errors_are_one_line(tmp_path, models, capsys, case) -> None:
    out = tmp_path / "o"
    if case == "one model":
        args = ["compare", str(models[0]), "--out", str(out)]
        message = "two or more models"
    else:
        out.mkdir()
        (out / "keep.txt").write_text("x")
        args = ["compare", str(models[0]), str(models[1]), "--out", str(out), "--force"]
        message = "holds no identifiable run"
    rc, _, err = run_main(args, capsys)
    assert rc == 2 and err.count("\n") == 1 and message in err, err
