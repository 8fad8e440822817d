"""A method that cannot run on a family is known before the first stage, left out, and
named in its section; the rest of the report is written (issue 26: a run used to stop at
the mixing stage after every paper stage had run).

The family: BLOOM with `apply_residual_connection_post_layernorm`, whose residual is taken
after the layer norm, a wiring no normalisation layout describes, so GlobEnc and ALTI are
undefined there while every other method runs."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from helpers.families import tiny_config
from identifiable.experiments.mixing import DEFAULT_METHODS
from identifiable.mixing import unavailable
from identifiable.models import Model


@pytest.fixture(scope="module")
def residual_after_norm(bert_tokenizer):
    from transformers import AutoModel

    cfg = tiny_config("bloom")
    cfg.apply_residual_connection_post_layernorm = True
    torch.manual_seed(0)
    return Model.from_hf(AutoModel.from_config(cfg, attn_implementation="eager"), bert_tokenizer)


def test_unavailable_names_the_norm_based_methods_with_the_reason(residual_after_norm, tiny_model):
    out = unavailable(residual_after_norm, DEFAULT_METHODS)
    assert sorted(out) == ["alti", "globenc"]
    assert all("bloom" in why.lower() for why in out.values())
    assert unavailable(tiny_model("bert"), DEFAULT_METHODS) == {}


def test_the_run_finishes_and_the_mixing_section_says_what_was_left_out(
    residual_after_norm, corpus, tmp_path
):
    from identifiable.runs.reproduce import reproduce

    run = reproduce(residual_after_norm, corpus, tmp_path / "run", budget="smoke", progress=False)
    left = pd.read_csv(run.out_dir / "tables" / "mixing_unavailable.csv")
    assert sorted(left["method"]) == ["alti", "globenc"]
    summary = pd.read_csv(run.out_dir / "tables" / "mixing_summary.csv")
    assert {"attention", "norm", "value-zeroing"} <= set(summary["method"])
    assert not {"alti", "globenc"} & set(summary["method"])
    page = (run.out_dir / "index.html").read_text(encoding="utf-8")
    assert "Not computed on this model: globenc" in page
    assert (run.out_dir / "tables" / "certify_rows.csv").is_file()  # the stage after it ran
