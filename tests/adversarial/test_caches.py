"""Malformed caches: valid JSON of the wrong shape, re-signed garbage, NaN states. A cache is
never trusted: each is recomputed with a one-line warning, never a traceback."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

from identifiable.store.cache import CacheCorruptWarning, RunCache
from identifiable.tokens import cache as token_cache
from identifiable.tokens.extract import TokenPairs

SETTINGS = {"model": "m", "seed": 0}

WRONG_SHAPES = [
    "[]",
    '"a string"',
    "42",
    "null",
    '{"key": "K", "files": []}',
    '{"key": "K", "files": {"t": 5}}',
    '{"key": "K", "files": {"../../escape": "0"}}',
    '{"key": "K", "files": {"t": "0"}, "meta": []}',
    "[" * 50_000 + "]" * 50_000,
]


def shard_cache(tmp_path: Path) -> RunCache:
    cache = RunCache(tmp_path, SETTINGS)
    cache.start()
    cache.save("stage", 0, {"t": pd.DataFrame({"x": [1.0, 2.0]})}, {"items": 2})
    return cache


@pytest.mark.parametrize("text", WRONG_SHAPES, ids=range(len(WRONG_SHAPES)))
def test_shard_manifest_of_the_wrong_shape_is_recomputed(tmp_path: Path, text: str) -> None:
    cache = shard_cache(tmp_path)
    assert cache.load("stage", 0) is not None
    manifest = tmp_path / ".cache" / "stage" / "00000.json"
    manifest.write_text(text.replace('"K"', json.dumps(cache.key)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.load("stage", 0) is None
    assert any(issubclass(w.category, CacheCorruptWarning) for w in caught)


@pytest.mark.parametrize("text", ["[]", '{"settings": []}', '"x"', "[" * 50_000])
def test_settings_of_the_wrong_shape_warn_and_do_not_block(tmp_path: Path, text: str) -> None:
    shard_cache(tmp_path)
    (tmp_path / ".cache" / "settings.json").write_text(text)
    cache = RunCache(tmp_path, SETTINGS)
    with pytest.warns(CacheCorruptWarning, match="malformed"):
        cache.check_resumable()
    assert cache.load("stage", 0) is not None  # shards carry the key: still safely reused


# ---- the token cache ---------------------------------------------------------------------


def pairs(n: int = 12, layers: int = 3, d: int = 8) -> TokenPairs:
    g = torch.Generator().manual_seed(0)
    return TokenPairs(
        states=torch.randn(n, layers, d, generator=g),
        seq_ids=torch.arange(n) // 4,
        input_ids=torch.arange(n) + 100,
        positions=torch.arange(n) % 4,
    )


def saved(tmp_path: Path) -> tuple[Path, Path]:
    data, manifest = token_cache.cache_paths(tmp_path, SETTINGS)
    token_cache.save_pairs(pairs(), data, manifest, SETTINGS)
    assert token_cache.load_pairs(data, manifest, SETTINGS) is not None
    return data, manifest


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: [],
        lambda m: {**m, "settings": ["model", "m"]},
        lambda m: {**m, "sha256": 12},
        lambda m: "just a string",
    ],
    ids=["list", "settings-list", "sha-int", "string"],
)
def test_token_manifest_of_the_wrong_shape_is_rebuilt(tmp_path: Path, edit) -> None:
    data, manifest = saved(tmp_path)
    manifest.write_text(json.dumps(edit(json.loads(manifest.read_text()))))
    with pytest.warns(token_cache.CacheCorruptWarning, match="unreadable manifest"):
        assert token_cache.load_pairs(data, manifest, SETTINGS) is None


def test_token_cache_resigned_with_nan_states_is_rebuilt(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    data, manifest = saved(tmp_path)
    bad = pairs()
    bad.states[3, 1, 2] = float("nan")
    save_file(
        {k: getattr(bad, k).contiguous() for k in ("states", "seq_ids", "input_ids", "positions")},
        str(data),
        metadata={"n_truncated": "0"},
    )
    info = json.loads(manifest.read_text())
    info["sha256"] = hashlib.sha256(data.read_bytes()).hexdigest()  # re-signed by hand
    manifest.write_text(json.dumps(info))
    with pytest.warns(token_cache.CacheCorruptWarning, match="NaN or infinite"):
        assert token_cache.load_pairs(data, manifest, SETTINGS) is None


# ---- through the CLI -----------------------------------------------------------------


def test_tokens_cli_recomputes_a_malformed_cache_with_one_warning(ws, model_dir) -> None:
    corpus = ws.root / "c.txt"
    corpus.write_text(
        "\n".join(f"Sentence number {i} is about a cat and a dog." for i in range(30)), "utf-8"
    )
    args = ["tokens", "--model", str(model_dir), "--corpus", str(corpus), "--max-tokens", "200"]
    args += ["--cache-dir", str(ws.root / "cache"), "--out", str(ws.root / "t"), "--layers", "1"]
    first = ws.main(args)
    assert first.code == 0, first.err
    (manifest,) = (ws.root / "cache").glob("token-pairs-*.json")
    manifest.write_text("[]")
    again = ws.main([*args, "--force"])  # the tables of the first run are replaced
    assert again.code == 0 and "Traceback" not in again.err
    warning_lines = [line for line in again.err_lines if line.startswith("warning:")]
    assert len(warning_lines) == 1 and "rebuilding it" in warning_lines[0]
    assert json.loads(manifest.read_text())["format"] == token_cache.FORMAT_VERSION
