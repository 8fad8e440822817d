"""`identifiable trace` on encoder–decoder and image models, through the real entry point.

Tiny random T5 and BART models (tests/helpers/families.py) are saved with the BERT tokenizer
into a folder and traced by `identifiable.cli.main`, as `identifiable trace SOURCE
--target TARGET --model DIR` would; a tiny ViT folder must give a one-line error.
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers.cli import run_main as run
from helpers.families import build_tiny_hf_model
from identifiable.models import Model

SOURCE = "The house is wonderful and the garden is large."
TARGET = "Das Haus ist wunderbar."


@pytest.fixture(scope="module")
def folders(tmp_path_factory, bert_tokenizer):
    root = tmp_path_factory.mktemp("cli-families")
    for arch in ("t5", "bart", "fsmt", "vit"):
        build_tiny_hf_model(arch).save_pretrained(root / arch)
        if arch != "vit":
            bert_tokenizer.save_pretrained(root / arch)
    return root


@pytest.mark.parametrize("arch", ["t5", "bart", "fsmt"])  # FSMT: fairseq's layout
def test_seq2seq_prints_three_tables_and_json(folders, arch, capsys, tmp_path, bert_tokenizer):
    out = tmp_path / "t.json"
    rc, stdout, stderr = run(
        ["trace", SOURCE, "--target", TARGET, "--model", str(folders / arch), "--json", str(out)],
        capsys,
    )
    assert rc == 0, stderr
    for line in ("encoder self-check: passed", "decoder self-check: passed"):
        assert line in stdout
    assert "cross self-check: passed" in stdout
    data = json.loads(out.read_text())
    n_s = len(bert_tokenizer(SOURCE)["input_ids"])
    n_t = len(bert_tokenizer(TARGET)["input_ids"])
    assert len(data["tokens"]) == n_s and len(data["decoder_tokens"]) == n_t
    att = data["attention"]
    assert (att["cross"]["n_queries"], att["cross"]["n_keys"]) == (n_t, n_s)
    assert (att["decoder"]["n_queries"], att["decoder"]["n_keys"]) == (n_t, n_t)
    assert (att["encoder"]["n_queries"], att["encoder"]["n_keys"]) == (n_s, n_s)
    assert f"{n_t} decoder tokens × {n_s} source tokens" in stdout
    # the CLI's figures are the API's: same model, same pair, same errors
    m = Model.from_hf(build_tiny_hf_model(arch), bert_tokenizer)
    tr = m.trace(SOURCE, TARGET)
    for part in ("encoder", "decoder", "cross"):
        expected = getattr(tr, part).reconstruction_errors()
        torch.testing.assert_close(
            torch.tensor(att[part]["reconstruction_error"], dtype=expected.dtype),
            expected,
            atol=1e-9,
            rtol=1e-3,
        )
        assert max(att[part]["reconstruction_error"]) < att[part]["tolerance"]
    assert data["reconstruction_error"] == att["encoder"]["reconstruction_error"]


def test_seq2seq_without_target_decodes_the_source(folders, capsys, tmp_path):
    out = tmp_path / "t.json"
    rc, _, stderr = run(
        ["trace", SOURCE, "--model", str(folders / "t5"), "--json", str(out)], capsys
    )
    assert rc == 0, stderr
    data = json.loads(out.read_text())
    assert len(data["decoder_tokens"]) == len(data["tokens"])


def test_image_model_is_a_one_line_error(folders, capsys, tmp_path):
    out = tmp_path / "t.json"
    rc, stdout, stderr = run(
        ["trace", "a photo", "--model", str(folders / "vit"), "--json", str(out)], capsys
    )
    assert rc == 2
    assert "is an image model" in stderr and "identifiable view --image" in stderr
    assert stderr.strip().count("\n") == 0 and "Traceback" not in stderr
    assert not out.exists() and stdout == ""


def test_target_on_an_encoder_is_a_one_line_error(tiny_model, tmp_path, capsys):
    folder = tmp_path / "bert"
    m = tiny_model("bert")
    m.hf_model.save_pretrained(folder)
    m.tokenizer.save_pretrained(folder)
    rc, _, stderr = run(["trace", "a text", "--target", "b", "--model", str(folder)], capsys)
    assert rc == 2
    assert "--target is for encoder–decoder models" in stderr
    assert stderr.strip().count("\n") == 0
