"""A cache folder the user names (`tokens --cache-dir`): the output-folder rules, up front.

The cache is shared between runs, so it is not swapped in like an output folder; but it
obeys the same places rule (`store.outdir`), checked before any work: not the filesystem
root, the home directory, the current directory or one of its ancestors, not a symbolic
link or a file, not inside a folder identifiable wrote (nor the command's own --out), it
holds nothing but cache files of ours, and it can be written (a read-only filesystem, or
a file where a folder should be, is one line, not an OSError after the extraction).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from identifiable.errors import IdentifiableError
from identifiable.store.files import is_temporary
from identifiable.store.outdir import enclosing_run
from identifiable.store.places import check_place, probe_writable
from identifiable.store.places import is_real_dir as _is_real_dir


def check_cache_dir(
    path: str | Path,
    ours: Callable[[str], bool],
    *,
    out: str | Path | None = None,
    option: str = "--cache-dir",
) -> Path:
    """Refuse a cache folder we must not write into; reads only (and one probe file).

    `ours(name)` says whether a file name is one of the cache's own; `out` is the command's
    output folder, which the cache must not be in. Returns the folder (`~` expanded).
    """
    folder = Path(path).expanduser()
    if str(path).strip() == "":
        raise IdentifiableError(f"{option} is empty; name a folder for the cache")
    check_place(folder, option, "a cache")
    enclosing = enclosing_run(folder / "x")  # the folder itself may be a run's folder
    if enclosing is not None:
        raise IdentifiableError(
            f"{option} {folder} is inside {enclosing}, a folder identifiable wrote; choose "
            "a folder outside it"
        )
    if out is not None:
        real, target = Path(os.path.realpath(folder)), Path(os.path.realpath(out))
        if real == target or target in real.parents:
            raise IdentifiableError(
                f"{option} {folder} is inside --out {out}; keep the cache outside the output"
            )
    if _is_real_dir(folder):
        foreign = sorted(
            e.name + ("/" if e.is_dir(follow_symlinks=False) else "")
            for e in os.scandir(folder)
            if e.is_dir(follow_symlinks=False)
            or e.is_symlink()
            or not (ours(e.name) or is_temporary(e.name))
        )
        if foreign:
            raise IdentifiableError(
                f"{option} {folder} holds {len(foreign)} entries that are not identifiable "
                f"cache files (e.g. {foreign[0]}); give the cache a folder of its own"
            )
    probe_writable(folder, option)
    return folder
