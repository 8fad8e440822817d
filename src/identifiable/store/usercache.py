"""identifiable's folder in the user's cache, for what is built once and reused by every run
(the safetensors weights dequantized from a GGUF file).

The root is `$IDENTIFIABLE_CACHE` when set, else `$XDG_CACHE_HOME/identifiable`, else
`~/.cache/identifiable`; each kind of entry has a folder of its own inside it. The root obeys
the places rule of every folder we write (`store.places`): not the filesystem root, the home
directory or the current folder, not a symbolic link or a file, and it can be written.
"""

from __future__ import annotations

import os
from pathlib import Path

from identifiable.errors import IdentifiableError
from identifiable.store.places import check_place, probe_writable

CACHE_ENV = "IDENTIFIABLE_CACHE"


def user_cache_root() -> Path:
    """The root of identifiable's user cache (not created here)."""
    given = os.environ.get(CACHE_ENV, "").strip()
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "identifiable"


def user_cache_dir(kind: str) -> Path:
    """The folder of `kind` in the user cache, checked and created; one line when it cannot be
    written (set $IDENTIFIABLE_CACHE to a folder that can)."""
    root = user_cache_root()
    where = f"the cache folder {root} (${CACHE_ENV})"
    try:
        check_place(root, f"${CACHE_ENV}", "a cache")
        probe_writable(root, f"${CACHE_ENV}")
    except IdentifiableError as err:
        raise IdentifiableError(f"{err}; set ${CACHE_ENV} to a folder you can write") from None
    folder = root / kind
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise IdentifiableError(
            f"cannot create {folder} in {where}: {err.strerror or err}; set ${CACHE_ENV} to a "
            "folder you can write"
        ) from None
    return folder
