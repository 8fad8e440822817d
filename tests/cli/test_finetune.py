"""`identifiable finetune`: resumable, a checkpoint every tool accepts, one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.cli import run_main
from helpers.corpora import save_tiny_model, word_paragraphs
from identifiable.errors import IdentifiableError
from identifiable.runs.finetune import finetune
from identifiable.training.loop import TrainSettings

SETTINGS = TrainSettings(
    steps=4, batch_size=2, max_tokens=40, min_tokens=18, save_every=2, warmup=1, lr=1e-3
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, bert_tokenizer) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-bert"), "bert", bert_tokenizer)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    return word_paragraphs(path, seed=0, paragraphs=15, sentences=6, words=(8, 14))


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_an_interrupted_run_resumes_to_the_same_weights(tmp_path, tiny_dir, corpus) -> None:
    whole = finetune(
        str(tiny_dir),
        0.5,
        tmp_path / "whole",
        corpus=str(corpus),
        settings=SETTINGS,
        evaluate=False,
    )
    log = whole.log
    assert list(log["step"]) == [1, 2, 3, 4] and log["null_fraction"].notna().all()

    def stop(step: int) -> None:
        if step == 3:
            raise KeyboardInterrupt

    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        finetune(
            str(tiny_dir),
            0.5,
            out,
            corpus=str(corpus),
            settings=SETTINGS,
            evaluate=False,
            on_step=stop,
        )
    assert not out.exists()  # the work is in the sibling partial folder
    with pytest.raises(IdentifiableError, match="--resume"):
        finetune(str(tiny_dir), 0.5, out, corpus=str(corpus), settings=SETTINGS, evaluate=False)
    lines: list[str] = []
    finetune(
        str(tiny_dir),
        0.5,
        out,
        corpus=str(corpus),
        settings=SETTINGS,
        evaluate=False,
        resume=True,
        log=lines.append,
    )
    assert "finetune w=0.5: resumed at step 2/4" in lines
    a, b = _weights(tmp_path / "whole"), _weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    original = _weights(tiny_dir)
    assert any(not torch.equal(a[k], original[k]) for k in a)  # training moved the weights


def test_the_checkpoint_loads_traces_reproduces_and_views(tmp_path, tiny_dir, corpus, capsys):
    from identifiable.models import load_model

    out = tmp_path / "ckpt"
    finetune(str(tiny_dir), 1.0, out, corpus=str(corpus), settings=SETTINGS, evaluate=False)
    m = load_model(str(out))
    assert m.fingerprint != load_model(str(tiny_dir)).fingerprint
    m.trace("a river runs through the old village").verify()
    rc, _, err = run_main(
        [
            "reproduce",
            "--model",
            str(out),
            "--corpus",
            str(corpus),
            "--budget",
            "smoke",
            "--out",
            str(tmp_path / "rep"),
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 0, err
    assert (tmp_path / "rep" / "index.html").is_file()
    rc, _, err = run_main(
        ["view", "a river runs", "--model", str(out), "--out", str(tmp_path / "v.html")], capsys
    )
    assert rc == 0, err
    assert (tmp_path / "v.html").stat().st_size > 1000


def test_a_small_sweep_writes_its_pareto_report(tmp_path, tiny_dir, corpus, capsys) -> None:
    out = tmp_path / "sweep"
    r = finetune(
        str(tiny_dir),
        [0, 2.0],
        out,
        corpus=str(corpus),
        settings=SETTINGS,
        held_out_pairs=3,
        held_out_sentences=12,
        held_out_options={"token_max_tokens": 300, "probe_steps": 5, "hta_pairs": 1},
    )
    assert list(r.pareto["model"]) == ["original", "w=0", "w=2"]
    # the evaluation says what it does, how to skip it, and each model as it finishes
    err = capsys.readouterr().err
    assert "skip with --no-evaluate" in err, err
    assert [line.split(" (")[0] for line in err.splitlines() if line.startswith("evaluated ")] == [
        "evaluated original",
        "evaluated w=0",
        "evaluated w=2",
    ]
    assert r.pareto.loc[0, "null_ratio_to_original"] == 1.0
    assert r.pareto.loc[0, "cosine_mean"] == pytest.approx(1.0)
    assert set(r.checkpoints) == {0.0, 2.0}
    assert (out / "penalty-2" / "model.safetensors").is_file()
    for name in (
        "index.html",
        "tables/pareto.csv",
        "tables/training_log.csv",
        "figures/pareto.svg",
        "figures/training_loss.png",
    ):
        assert (out / name).is_file(), name
    assert "Goal" in (out / "index.html").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--penalty", "-0.1"], "--penalty -0.1 must be a finite number between 0 and 1000"),
        (["--penalty", "nan"], "--penalty nan must be a finite number between 0 and 1000"),
        (["--penalty", "0.1,"], "--penalty takes weights"),
        (["--steps", "0"], "--steps 0 must be at least 1"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys, args, message) -> None:
    rc, _, err = run_main(["finetune", "--out", str(tmp_path / "o"), *args], capsys)
    assert rc == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "o").exists()


def test_a_folder_that_is_not_ours_is_refused(tmp_path, capsys) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    rc, _, err = run_main(["finetune", "--out", str(out), "--force"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "holds no identifiable run" in err, err
    assert (out / "notes.txt").read_text() == "keep me"


def test_a_model_without_attention_maps_is_refused(tmp_path, capsys, bert_tokenizer) -> None:
    from transformers import AutoConfig, AutoModel

    cfg = AutoConfig.for_model(
        "mamba", hidden_size=16, num_hidden_layers=1, state_size=4, vocab_size=30522
    )
    path = tmp_path / "mamba"
    AutoModel.from_config(cfg).save_pretrained(path)
    bert_tokenizer.save_pretrained(path)
    capsys.readouterr()  # the progress bar of save_pretrained above
    rc, _, err = run_main(["finetune", "--model", str(path), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error:"), err
    assert not (tmp_path / "o").exists()
