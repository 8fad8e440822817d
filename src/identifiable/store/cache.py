"""Resumable per-stage, per-shard cache of a reproduction run, with checksums.

Layout under the output folder:

    .cache/settings.json              what the run was started with (and its key)
    .cache/<stage>/<shard>.json       manifest, written last: sha256 of each table file
    .cache/<stage>/<shard>.<table>.parquet

A shard counts as done only when its manifest exists and every file matches its
checksum, so a run killed at any instant (even mid-write) resumes cleanly: a torn
or corrupted shard is simply computed again. Parquet stores float64 exactly, so
tables read back from the cache equal the ones computed, and a resumed run writes
the same outputs as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from identifiable.errors import IdentifiableError
from identifiable.store.files import atomic_write_bytes, atomic_write_text, sha256_bytes

CACHE_DIR = ".cache"


class CacheCorruptWarning(UserWarning):
    """A cached shard failed its checksum and will be recomputed."""


def settings_key(settings: dict[str, Any]) -> str:
    """Stable hash of JSON-able settings."""
    blob = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:20]


class RunCache:
    """The `.cache` folder of one output directory, bound to one run's settings."""

    def __init__(self, out_dir: Path, settings: dict[str, Any]) -> None:
        self.root = Path(out_dir) / CACHE_DIR
        self.settings = settings
        self.key = settings_key(settings)

    # ---- run level -----------------------------------------------------------
    def previous_settings(self) -> dict[str, Any] | None:
        """What the run in this folder was started with; None if none (or unreadable)."""
        path = self.root / "settings.json"
        if not path.is_file():
            return None
        try:
            prev = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError, RecursionError):
            prev = None
        if not (isinstance(prev, dict) and isinstance(prev.get("settings", {}), dict)):
            # Every shard carries the settings key too, so nothing of another run is reused.
            warnings.warn(
                f"{path} is unreadable or malformed; its cached shards are checked one by one",
                CacheCorruptWarning,
                stacklevel=2,
            )
            return None
        return prev

    def check_resumable(self) -> None:
        """Raise unless the cache is empty or was written with the same settings."""
        prev = self.previous_settings()
        if prev is None:
            return
        if settings_key(prev.get("settings", {})) != self.key:
            changed = sorted(
                k
                for k in set(prev.get("settings", {})) | set(self.settings)
                if prev.get("settings", {}).get(k) != self.settings.get(k)
            )
            raise IdentifiableError(
                "cannot resume: the run in this folder used different settings "
                f"({', '.join(changed)}); rerun with the same arguments, or use --force to start over"
            )

    def start(self) -> None:
        atomic_write_text(
            self.root / "settings.json",
            json.dumps(
                {"key": self.key, "settings": self.settings}, indent=2, sort_keys=True, default=str
            ),
        )

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # ---- shards --------------------------------------------------------------
    def _manifest(self, stage: str, shard: int) -> Path:
        return self.root / stage / f"{shard:05d}.json"

    def _table(self, stage: str, shard: int, name: str) -> Path:
        return self.root / stage / f"{shard:05d}.{name}.parquet"

    def finished(self, stage: str, shard: int) -> bool:
        """Whether this run's shard is cached (its manifest only; `load` checks the tables)."""
        try:
            info = json.loads(self._manifest(stage, shard).read_text("utf-8"))
        except (OSError, ValueError, RecursionError):
            return False
        return isinstance(info, dict) and info.get("key") == self.key

    def load(self, stage: str, shard: int) -> tuple[dict[str, pd.DataFrame], dict[str, Any]] | None:
        """(tables, meta) of a finished shard, or None if missing or corrupt."""
        manifest = self._manifest(stage, shard)
        if not manifest.is_file():
            return None
        try:
            info = json.loads(manifest.read_text("utf-8"))
            if not isinstance(info, dict) or not isinstance(info.get("files"), dict):
                raise ValueError("malformed manifest")
            if info.get("key") != self.key:
                return None
            tables = {}
            for name, digest in info["files"].items():
                if not isinstance(name, str) or "/" in name or name.startswith("."):
                    raise ValueError(f"malformed table name {name!r}")
                data = self._table(stage, shard, name).read_bytes()
                if sha256_bytes(data) != digest:
                    raise ValueError(f"checksum mismatch in table '{name}'")
                tables[name] = pd.read_parquet(io.BytesIO(data))
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
            warnings.warn(
                f"cached {stage} shard {shard} is unusable ({err}); recomputing it",
                CacheCorruptWarning,
                stacklevel=2,
            )
            return None
        meta = info.get("meta", {})
        return tables, meta if isinstance(meta, dict) else {}

    def save(
        self,
        stage: str,
        shard: int,
        tables: dict[str, pd.DataFrame],
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Store a shard: tables first, the manifest (with their checksums) last."""
        digests = {}
        for name, df in tables.items():
            buf = io.BytesIO()
            df.to_parquet(buf, index=False)
            data = buf.getvalue()
            atomic_write_bytes(self._table(stage, shard, name), data)
            digests[name] = sha256_bytes(data)
        info = {
            "key": self.key,
            "stage": stage,
            "shard": shard,
            "files": digests,
            "meta": meta or {},
        }
        atomic_write_text(
            self._manifest(stage, shard), json.dumps(info, indent=1, sort_keys=True, default=str)
        )
