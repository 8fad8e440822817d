"""Small first-contact defects, each through the surface a user meets: `identifiable models`
lists every family README names (encoder–decoder ones included), and `to_bertviz` on a
result without attention heads says what to use instead."""

from __future__ import annotations

import pytest
import torch

from identifiable.attribution.api import HTAResult
from identifiable.errors import IdentifiableError


def test_models_lists_encoder_decoder_families(capsys) -> None:
    from helpers.cli import run_main

    code, out, err = run_main(["models"], capsys)
    assert code == 0, err
    for family in ("t5", "bart", "mbart", "marian", "bert", "llama"):
        assert family in out, family


def test_models_norm_column_is_the_specs_norm_layout() -> None:
    from identifiable.cli.trace import _wiring
    from identifiable.models import SEQ2SEQ_SPECS, SPECS

    table = {s.name: s for s in SPECS}
    got = [_wiring(table[name]) for name in ("bert", "xlnet", "llama", "falcon")]
    assert got == ["post-LN", "post-LN", "pre-LN", "pre-LN"]  # falcon: parallel, pre-normalised
    assert _wiring(SEQ2SEQ_SPECS[0].encoder) == "—"  # T5 describes no layout


def _hta(n: int = 5) -> HTAResult:
    c = torch.full((2, n, n), 1.0 / n, dtype=torch.float64)
    return HTAResult(
        contributions=c, stderr=None, sq_norms=c, sq_norms_stderr=None,
        tokens=[f"t{i}" for i in range(n)], input_ids=torch.arange(n),
        special=torch.zeros(n, dtype=torch.bool), probes=None, seed=0, n_jvps=0,
        chunk_size=1, seconds=0.0,
    )  # fmt: skip


def test_to_bertviz_on_hta_names_what_to_use() -> None:
    with pytest.raises(IdentifiableError) as err:
        _hta().to_bertviz()
    message = str(err.value)
    assert "None" not in message and "HTAResult has none" in message
    assert "effective_attention" in message
    with pytest.raises(IdentifiableError, match="contributions is not one"):
        _hta().to_bertviz("contributions")
