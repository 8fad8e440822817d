"""The Fig. 2 stage split into one shard per layer equals one run over all layers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from helpers.corpora import small_corpus
from identifiable.experiments.pipeline import concat_reduce
from identifiable.experiments.stages import with_budget
from identifiable.experiments.tokens import token_tables


def test_layer_shards_concatenate_to_the_whole_run(tiny_model: Any, tmp_path: Path) -> None:
    model = tiny_model("bert")
    items = small_corpus(60)
    # a real Adam grid (two learning rates) so that the selection on the deepest layer matters
    budget = with_budget("smoke", probe_max_steps=40, probe_lr_grid=(1e-3, 3e-3))
    whole = token_tables(model, items, budget, 0, tmp_path / "cache", lambda _k: None)
    parts = [
        token_tables(model, items, budget, 0, tmp_path / "cache", lambda _k: None, layer=layer)
        for layer in range(1, model.info.n_layers + 1)
    ]
    merged = concat_reduce(parts)
    assert sorted(merged) == sorted(whole)
    for name, df in whole.items():
        pd.testing.assert_frame_equal(merged[name], df, check_dtype=False, obj=name)
    assert set(parts[1]) == {"per_layer", "cross_layer", "control", "fits", "grid"}
    # every layer's probe is tested on every layer
    assert len(merged["cross_layer"]) == len(whole["cross_layer"]) > 0
