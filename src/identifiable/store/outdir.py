"""The life cycle of an output folder (`reproduce --out DIR`, `tokens --out DIR`): nothing lost,
nothing foreign deleted. One policy for every command that writes a folder.

Rules, in the order a run meets them:

1. `check()` is read-only and runs before anything is loaded: the folder must not be the
   filesystem root, the home directory, the current directory or one of its ancestors,
   a symbolic link, a file, or inside a folder identifiable wrote (a finished run or a
   work folder); its parent must take a file (probed; see `store.places`). A run that is
   live in it right now (its lock is held) is named as such. A non-empty folder needs
   `--resume` or `--force`, and `--force` only ever replaces a finished run of ours of the
   same command (see 3). A command without `--resume` (`resumable=False`) never advises it,
   and starts an interrupted run of its own over.
2. `run()` (after the model, corpus and device were validated) takes an exclusive lock
   (`fcntl.flock` on the sibling `.DIR.identifiable.lock`), so a second run into the same
   folder refuses with one line, and works in the sibling folder `.DIR.identifiable-partial`
   (marked `.cache/run.json` at once): the shard cache and then the outputs are written
   there, never through the old folder. A run that fails or is interrupted leaves that
   folder for `--resume` and the previous outputs in DIR untouched.
3. On success the temporary files a killed writer left in the work folder are removed, the
   work folder gets a manifest (`.cache/manifest.json`: the command, size and SHA-256 of
   every file, and every folder) and is swapped in for DIR with one atomic
   `renameat2(RENAME_EXCHANGE)` (two renames where the kernel lacks it). The previous run is
   then deleted entry by entry, and only the entries its own manifest lists with unchanged
   content; a folder holding anything else (a file we did not write, an edited page, a
   symbolic link) is never deleted and `--force` refuses it up front.

The rules live in three modules: `store.outdir_checks` (1, read-only), `store.outdir_run`
(2 and 3, the transaction) and `store.manifest` (what a finished run holds, and deleting
only that); `OutputFolder` combines them, and this module keeps every name they export.

Symbolic links are never followed: every walk uses `lstat` and nothing is removed through a
link. A manifest that cannot be read (missing, malformed, nested 200k deep) vouches for
nothing.
"""

from __future__ import annotations

from pathlib import Path

from identifiable.store.manifest import (
    CACHE,
    MANIFEST,
    RUN_MARKER,
    foreign_entries,
    read_manifest,
    remove_run,
    write_manifest,
)
from identifiable.store.outdir_checks import _partial, enclosing_run, nested_runs
from identifiable.store.outdir_run import FolderRun

__all__ = [
    "CACHE",
    "MANIFEST",
    "RUN_MARKER",
    "OutputFolder",
    "enclosing_run",
    "foreign_entries",
    "nested_runs",
    "read_manifest",
    "remove_run",
    "write_manifest",
]


class OutputFolder(FolderRun):
    """An output folder and the rules for writing it (see the module docstring).

    `check()` before loading anything; then `with folder.run(check_settings) as work:`
    write everything into `work`; on a clean exit it becomes `out`.

    `kind` names the command that writes the folder ("reproduce", "tokens"): `--force`
    replaces only a finished run of the same kind. `resumable=False` for a command without
    `--resume`, whose messages then never advise it.
    """

    def __init__(
        self,
        out: str | Path,
        *,
        resume: bool = False,
        force: bool = False,
        kind: str = "reproduce",
        resumable: bool = True,
    ) -> None:
        self.out = Path(out)
        self.resume = resume
        self.force = force
        self.kind = kind
        self.resumable = resumable
        self.partial = _partial(self.out)
        self._locked = False
