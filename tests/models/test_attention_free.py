"""An attention-free model (Mamba, a state-space model) is refused in one line that says
why and what to use, from Python and from the CLI (exit 2), not with transformers'
AttributeError about `num_attention_heads` (issue 24's note)."""

from __future__ import annotations

import pytest

from helpers.cli import run_main
from identifiable import IdentifiableError, load_model


def _mamba():
    from transformers import AutoConfig, AutoModel

    cfg = AutoConfig.for_model(
        "mamba", hidden_size=32, num_hidden_layers=2, vocab_size=128, state_size=4,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return AutoModel.from_config(cfg).eval()


def test_python_caller_gets_one_line(bert_tokenizer):
    with pytest.raises(IdentifiableError, match="no attention heads") as err:
        load_model(_mamba(), tokenizer=bert_tokenizer)
    assert "\n" not in str(err.value) and "'mamba'" in str(err.value)


def test_cli_says_it_in_one_line_with_status_2(tmp_path, bert_tokenizer, capsys):
    _mamba().save_pretrained(tmp_path / "mamba")
    bert_tokenizer.save_pretrained(tmp_path / "mamba")
    capsys.readouterr()  # transformers' own "Writing model shards" bar is not ours
    rc, out, err = run_main(["trace", "some words", "--model", str(tmp_path / "mamba")], capsys)
    assert rc == 2 and not out, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "attention-free" in lines[0], err
    assert "Traceback" not in err
