"""The self-testing family table (issue 54): every model type the installed transformers
registers has a row in tests/models/family_table.json; each family recorded as verified or
refused by name is rebuilt from a tiny random config and must still be so. Regenerate with
`scripts/family_table.py` (docs/families.md, 'Every registered model type')."""

from __future__ import annotations

import pytest

from helpers.family_table import TABLE, classify, load_table

RECORDED = load_table()


def _same_transformers() -> None:
    import transformers

    if transformers.__version__ != RECORDED["transformers"]:
        pytest.skip(
            f"the table was recorded with transformers {RECORDED['transformers']}, this is "
            f"{transformers.__version__} (other model types): regenerate it there"
        )


def test_every_registered_model_type_has_a_row():
    _same_transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    missing = sorted(set(CONFIG_MAPPING_NAMES) - set(RECORDED["families"]))
    assert not missing, f"run scripts/family_table.py --only {' '.join(missing[:10])}"


KEPT = sorted(t for t, r in RECORDED["families"].items() if r["status"] in ("verified", "refused"))


@pytest.mark.slow
@pytest.mark.parametrize("model_type", KEPT)
def test_a_family_that_passed_still_passes(model_type):
    _same_transformers()
    row = RECORDED["families"][model_type]
    got = classify(model_type)
    assert got.status == row["status"], (
        f"{model_type} was {row['status']} and is now {got.status}: {got.reason} "
        f"(if intended, regenerate {TABLE.name} with scripts/family_table.py --only {model_type})"
    )
    if got.status == "verified":
        assert got.family == row["family"]
