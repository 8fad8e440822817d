"""Fixtures of the training tests."""

from __future__ import annotations

import pytest

from helpers.families import build_tiny_hf_model


@pytest.fixture(scope="module")
def tiny64(bert_tokenizer):
    """Factory: a float64 tiny model of `arch`, wrapped (cached per arch in the module)."""
    from identifiable.models import Model

    cache: dict[str, Model] = {}

    def make(arch: str) -> Model:
        if arch not in cache:
            hf = build_tiny_hf_model(arch).double()
            cache[arch] = Model.from_hf(hf, bert_tokenizer, name=f"tiny-{arch}")
        return cache[arch]

    return make
