"""On-disk cache of extracted `TokenPairs`: safetensors data plus a JSON manifest.

Layout in `cache_dir`: `token-pairs-<key>.safetensors` and `token-pairs-<key>.json`,
with `<key>` a hash of the settings (model fingerprint, corpus fingerprint, token
cap, storage dtype, format version). So a different model, corpus or setting
looks up a different file and can never pick up another run's data.

On load the manifest must repeat exactly the expected settings; if it does not
(a file copied or renamed by hand), `CacheMismatchError` is raised and nothing is
reused. A data file whose sha256 differs from the manifest's, or that fails to
parse, is corrupt: `load_pairs` warns and returns None, and the caller rebuilds.
Both files are written by the store's one atomic writer (`store.files`: temporary
file, fsync, rename; a full disk is one line), data first, so a manifest only ever
describes a complete data file. The key and the corruption warning are the store's too
(`store.cache.settings_key`, `store.cache.CacheCorruptWarning`).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from identifiable.errors import IdentifiableError
from identifiable.store.cache import CacheCorruptWarning, settings_key
from identifiable.store.files import atomic_write_text, atomic_write_with, sha256_file
from identifiable.tokens.extract import TokenPairs

FORMAT_VERSION = 1
_TENSORS = ("states", "seq_ids", "input_ids", "positions")


class CacheMismatchError(IdentifiableError):
    """A cache file describes different settings than the run asks for."""


__all__ = [
    "CacheCorruptWarning",
    "CacheMismatchError",
    "cache_key",
    "cache_paths",
    "corpus_fingerprint",
    "load_pairs",
    "save_pairs",
]


def corpus_fingerprint(corpus: Iterable[Any]) -> str | None:
    """The corpus's own `.fingerprint`, else a sha256 of its items (streamed, bounded memory).

    Returns None for a one-shot iterator without `.fingerprint`: hashing it would
    consume it.
    """
    fp = getattr(corpus, "fingerprint", None)
    if callable(fp):
        fp = fp()
    if fp:
        return str(fp)
    if iter(corpus) is corpus:
        return None
    h = hashlib.sha256()
    for item in corpus:
        h.update(json.dumps(item, ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def cache_key(settings: dict[str, Any]) -> str:
    """The store's `settings_key`, cut to the 16 hex digits of the token cache's file names."""
    return settings_key(settings)[:16]


def cache_paths(cache_dir: str | Path, settings: dict[str, Any]) -> tuple[Path, Path]:
    """(data file, manifest file) for these settings in `cache_dir`."""
    stem = Path(cache_dir).expanduser() / f"token-pairs-{cache_key(settings)}"
    return stem.with_suffix(".safetensors"), stem.with_suffix(".json")


def save_pairs(
    pairs: TokenPairs, data_path: Path, manifest_path: Path, settings: dict[str, Any]
) -> None:
    """Write `pairs` and its manifest atomically."""
    from safetensors.torch import save_file

    tensors = {name: getattr(pairs, name).contiguous() for name in _TENSORS}
    digests: list[str] = []

    def write(_fd: int, tmp: Path) -> None:  # safetensors saves to a path only
        save_file(tensors, str(tmp), metadata={"n_truncated": str(pairs.n_truncated)})
        digests.append(sha256_file(tmp))

    atomic_write_with(data_path, write, hint="choose another cache directory")
    digest = digests[0]
    manifest = {
        "format": FORMAT_VERSION,
        "settings": settings,
        "sha256": digest,
        "n_tokens": pairs.n_tokens,
        "n_sequences": pairs.n_sequences,
        "states_shape": list(pairs.states.shape),
        "dtype": str(pairs.states.dtype).removeprefix("torch."),
    }
    atomic_write_text(manifest_path, json.dumps(manifest, indent=2, sort_keys=True))


def _corrupt(path: Path, why: str) -> None:
    warnings.warn(
        f"token cache {path} is corrupt ({why}); rebuilding it", CacheCorruptWarning, stacklevel=3
    )


def load_pairs(data_path: Path, manifest_path: Path, settings: dict[str, Any]) -> TokenPairs | None:
    """Load cached pairs written with exactly `settings`.

    Returns:
        The pairs, or None when there is no cache or it is corrupt (a warning says which).
    Raises:
        CacheMismatchError: the manifest records other settings.
    """
    if not manifest_path.exists() or not data_path.exists():
        return None
    try:
        manifest = json.loads(manifest_path.read_text())
        recorded = manifest["settings"]
        digest = manifest["sha256"]
        if not isinstance(recorded, dict) or not isinstance(digest, str):
            raise TypeError("settings must be an object and sha256 a string")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        _corrupt(manifest_path, f"unreadable manifest: {exc}")
        return None
    if recorded != settings:
        diff = sorted(
            k for k in set(recorded) | set(settings) if recorded.get(k) != settings.get(k)
        )
        raise CacheMismatchError(
            f"token cache {data_path} was written with other settings (differs in: {', '.join(diff)}); "
            "it is not reused. Delete it or choose another cache directory"
        )
    if sha256_file(data_path) != digest:
        _corrupt(data_path, "sha256 does not match the manifest")
        return None
    try:
        from safetensors import safe_open

        with safe_open(str(data_path), framework="pt") as f:
            tensors = {name: f.get_tensor(name) for name in _TENSORS}
            n_truncated = int((f.metadata() or {}).get("n_truncated", 0))
    except Exception as exc:  # safetensors raises its own error types
        _corrupt(data_path, f"unreadable: {exc}")
        return None
    if list(tensors["states"].shape) != manifest.get("states_shape"):
        _corrupt(data_path, "tensor shapes do not match the manifest")
        return None
    if tensors["states"].is_floating_point() and not bool(tensors["states"].isfinite().all()):
        # A forward pass never yields NaN or inf here; a file re-signed by hand can.
        _corrupt(data_path, "hidden states hold NaN or infinite values")
        return None
    return TokenPairs(n_truncated=n_truncated, **tensors)
