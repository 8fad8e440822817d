"""What a finished run of ours holds, and the only deletions and copies we make of it.

A run's manifest (`.cache/manifest.json`) lists the command that wrote the folder and the
size and SHA-256 of every file, and every folder; a folder is deleted only entry by entry
and only where the manifest vouches for every entry (`remove_run`). Symbolic links are
never followed: every walk uses `lstat`, and nothing is removed through a link. A manifest
that cannot be read (missing, malformed, nested 200k deep) vouches for nothing. The rules
of an output folder that use these are in `store.outdir`.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from identifiable.errors import IdentifiableError
from identifiable.store.places import is_link as _is_link
from identifiable.store.places import is_real_dir as _is_real_dir

CACHE = ".cache"
MANIFEST = "manifest.json"  # inside CACHE
RUN_MARKER = "run.json"  # inside CACHE: written first, so a killed run is known as ours
_FORMAT = 1


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of everything under `root`, parents before children; no links followed."""
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(root / rel if rel else root) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                child = f"{rel}/{entry.name}" if rel else entry.name
                st = entry.stat(follow_symlinks=False)
                yield child, st
                if stat.S_ISDIR(st.st_mode):
                    stack.append(child)


def write_manifest(root: Path, kind: str = "reproduce") -> dict[str, Any]:
    """Record every file (size, SHA-256) and folder under `root` in `root/.cache/manifest.json`,
    with the command (`kind`) that wrote the folder."""
    files: dict[str, dict[str, Any]] = {}
    dirs: list[str] = []
    for rel, st in _walk(root):
        if rel == f"{CACHE}/{MANIFEST}":
            continue
        if stat.S_ISDIR(st.st_mode):
            dirs.append(rel)
        elif stat.S_ISREG(st.st_mode):
            files[rel] = {"size": st.st_size, "sha256": _sha256(root / rel)}
        else:  # we never create links or special files: refuse to vouch for one
            raise IdentifiableError(
                f"{root / rel} is not a regular file; something else writes into this folder"
            )
    manifest = {
        "format": _FORMAT,
        "writer": "identifiable",
        "kind": kind,
        "files": files,
        "dirs": sorted(dirs),
    }
    from identifiable.store.files import atomic_write_text

    atomic_write_text(root / CACHE / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def read_manifest(root: Path) -> dict[str, Any] | None:
    """The manifest of a finished run in `root`, or None (missing, unreadable or malformed)."""
    path = root / CACHE / MANIFEST
    if _is_link(root / CACHE) or _is_link(path) or not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: 200k-deep JSON
        return None
    if not (
        isinstance(manifest, dict)
        and manifest.get("writer") == "identifiable"
        and isinstance(manifest.get("files"), dict)
        and isinstance(manifest.get("dirs"), list)
        and all(
            isinstance(v, dict)
            and isinstance(v.get("size"), int)
            and isinstance(v.get("sha256"), str)
            for v in manifest["files"].values()
        )
    ):
        return None
    return manifest


def foreign_entries(root: Path, manifest: dict[str, Any]) -> list[str]:
    """Entries under `root` that the manifest does not vouch for (extra, changed or links)."""
    files, dirs = manifest["files"], set(manifest["dirs"])
    foreign = []
    for rel, st in _walk(root):
        if rel == f"{CACHE}/{MANIFEST}":
            continue
        if stat.S_ISDIR(st.st_mode):
            if rel not in dirs:
                foreign.append(rel + "/")
        elif not stat.S_ISREG(st.st_mode):
            foreign.append(rel)
        else:
            want = files.get(rel)
            if want is None or want["size"] != st.st_size or want["sha256"] != _sha256(root / rel):
                foreign.append(rel)
    return foreign


def remove_tree(root: Path) -> None:
    """Delete `root` without following links (links themselves are unlinked, never their targets)."""
    entries = list(_walk(root))
    for rel, st in reversed(entries):  # children before parents
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(root / rel)
        else:
            os.unlink(root / rel)
    os.rmdir(root)


def remove_run(root: Path) -> None:
    """Delete a finished run of ours, entry by entry, only what its manifest vouches for.

    Raises:
        IdentifiableError: the folder holds something the manifest does not list.
    """
    manifest = read_manifest(root)
    if manifest is None:
        raise IdentifiableError(f"{root} holds no identifiable run; it was not deleted")
    foreign = foreign_entries(root, manifest)
    if foreign:
        raise IdentifiableError(
            f"{root} holds {len(foreign)} entries identifiable did not write (e.g. {foreign[0]}); "
            "it was not deleted"
        )
    remove_tree(root)


def link_tree(src: Path, dst: Path) -> None:
    """Hard-link (copy where links are refused) a finished run's cache into a new work folder.

    Cache files are only ever replaced by rename, never modified in place, so sharing
    inodes cannot let the new run change the old run's files.
    """
    import shutil

    if not _is_real_dir(src):
        return
    os.mkdir(dst)
    for rel, st in _walk(src):
        if rel == MANIFEST:
            continue
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(dst / rel)
        elif stat.S_ISREG(st.st_mode):
            try:
                os.link(src / rel, dst / rel, follow_symlinks=False)
            except OSError:
                shutil.copy2(src / rel, dst / rel, follow_symlinks=False)
