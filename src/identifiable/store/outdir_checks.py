"""The read-only half of an output folder's rules (`store.outdir`): where a run may write,
and whether a non-empty folder may be resumed or replaced. Nothing here writes: `check()`
runs before anything is loaded, and again under the run's lock (`store.outdir_run`).

A folder is refused when it is the filesystem root, the home directory, the current
directory or one of its ancestors, a symbolic link, a file, or inside a folder identifiable
wrote (a finished run or a work folder, other than the caller's own, `nested_runs`); when a
live run holds its lock; or when it is not empty and neither `--resume` nor `--force`
applies (`--force` replaces only a finished run of ours of the same command).
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from identifiable.errors import IdentifiableError
from identifiable.store.manifest import CACHE, RUN_MARKER, foreign_entries, read_manifest
from identifiable.store.places import check_place, probe_writable
from identifiable.store.places import exists as _exists
from identifiable.store.places import is_link as _is_link
from identifiable.store.places import is_real_dir as _is_real_dir
from identifiable.store.places import refused_location as _refused_location


def _partial(out: Path) -> Path:
    return out.parent / f".{out.name}.identifiable-partial"


def _lockfile(out: Path) -> Path:
    return out.parent / f".{out.name}.identifiable.lock"


# Work folders of live runs of ours that may hold runs of their own (`compare` writes one
# reproduction per model inside its work folder); set only by `nested_runs`.
_HOSTS: contextvars.ContextVar[tuple[Path, ...]] = contextvars.ContextVar("hosts", default=())


@contextlib.contextmanager
def nested_runs(work: Path) -> Iterator[None]:
    """Let runs written while this is open land inside `work`, the caller's own work folder
    (every other folder of ours still refuses a run inside it)."""
    token = _HOSTS.set((*_HOSTS.get(), Path(os.path.realpath(work))))
    try:
        yield
    finally:
        _HOSTS.reset(token)


def enclosing_run(out: Path) -> Path | None:
    """The folder of ours that `out` would land inside (a finished run, or a work folder),
    other than the work folder of a run that hosts it (`nested_runs`)."""
    resolved = Path(os.path.realpath(out))
    hosts = _HOSTS.get()
    for parent in resolved.parents:
        if parent in hosts:
            return None
        if parent.name.endswith(".identifiable-partial") or read_manifest(parent) is not None:
            return parent
    return None


def _lock_holder(out: Path) -> str | None:
    """The pid of a live run holding `out`'s lock ("?" if unreadable), or None. Reads only:
    an existing lock file is opened read-only and tested with a shared, non-blocking flock."""
    try:
        fd = os.open(_lockfile(out), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        with contextlib.suppress(OSError):
            return os.read(fd, 32).decode("ascii", "replace").strip() or "?"
        return "?"
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


class FolderChecks:
    """`check()` of `OutputFolder` and the questions it asks of the folder (reads only)."""

    out: Path
    resume: bool
    force: bool
    kind: str
    resumable: bool
    partial: Path
    _locked: bool

    # ---- read-only checks ------------------------------------------------------
    def check(self) -> None:
        """Refuse a folder we must not write into; reads only."""
        try:
            self._check()
        except OSError as err:
            raise IdentifiableError(
                f"cannot use output folder {self.out}: {err.strerror or err}; choose another --out"
            ) from None

    def _check(self) -> None:
        out = self.out
        if self.resume and self.force:
            raise IdentifiableError("give --resume or --force, not both")
        self._check_location()
        interrupted = self._partial_is_ours()
        if not self._locked:
            holder = _lock_holder(out)
            if holder is not None:
                raise IdentifiableError(
                    f"another identifiable run (process {holder}) is writing to {out} right "
                    "now; wait for it to finish, or choose another --out"
                )
        if _exists(self.partial) and not interrupted and not self._partial_is_empty():
            raise IdentifiableError(
                f"{self.partial} holds files identifiable did not write; move it or choose another --out"
            )
        if self.force:
            self._check_replaceable()
            return
        if self.resume:
            self._check_resumable(interrupted)
            return
        if interrupted and self.resumable:  # without --resume it is simply started over
            raise IdentifiableError(
                f"a run into {out} was interrupted (its work is in {self.partial}): pass "
                "--resume to continue it, --force to start over, or choose another --out"
            )
        if _is_real_dir(out) and any(os.scandir(out)):
            if self._is_ours():
                resume = "pass --resume to reuse it, " if self.resumable else ""
                raise IdentifiableError(
                    f"output folder {out} is not empty (it holds a finished run): {resume}"
                    "pass --force to replace it, or choose another --out"
                )
            only = "--resume and --force only work" if self.resumable else "--force only works"
            raise IdentifiableError(
                f"output folder {out} is not empty and holds no identifiable {self.kind} run: "
                f"choose another --out ({only} on a run of ours)"
            )

    def _check_location(self) -> None:
        """Not /, HOME, the current folder or above, a link, a file, or inside a run of ours."""
        out = self.out
        if str(out) == "" or out.name in ("", ".", ".."):
            where = _refused_location(out) or "not a folder name"
            raise IdentifiableError(f"--out {str(out)!r} is {where}; name a new folder")
        check_place(out, "--out", "an output folder")
        enclosing = enclosing_run(out)
        if enclosing is not None:
            raise IdentifiableError(
                f"--out {out} is inside {enclosing}, a folder identifiable wrote (its --force "
                "would then refuse it); choose a folder outside it"
            )
        if _exists(self.partial) and not _is_real_dir(self.partial):
            raise IdentifiableError(
                f"{self.partial} is in the way (not a folder we wrote); move it or choose another --out"
            )
        probe_writable(out.parent, "--out")  # the work folder and the lock go beside `out`

    def _check_resumable(self, interrupted: bool) -> None:
        out = self.out
        if interrupted or (self._is_ours() and not self._foreign()):
            return
        if _is_real_dir(out) and self._is_ours():
            raise IdentifiableError(
                f"cannot resume in {out}: it holds files identifiable did not write "
                f"(e.g. {self._foreign()[0]}); move them or choose another --out"
            )
        if _is_real_dir(out) and any(os.scandir(out)):
            raise IdentifiableError(
                f"cannot resume in {out}: it holds no identifiable run; choose another --out"
            )
        # nothing to resume: a fresh run

    def _manifest(self) -> dict[str, Any] | None:
        return read_manifest(self.out) if _is_real_dir(self.out) else None

    def _is_ours(self) -> bool:
        manifest = self._manifest()
        return manifest is not None and manifest.get("kind", "reproduce") == self.kind

    def _foreign(self) -> list[str]:
        manifest = read_manifest(self.out)
        return foreign_entries(self.out, manifest) if manifest is not None else []

    def _partial_is_empty(self) -> bool:
        return _is_real_dir(self.partial) and not any(os.scandir(self.partial))

    def _partial_is_ours(self) -> bool:
        cache = self.partial / CACHE
        if not (_is_real_dir(self.partial) and _is_real_dir(cache)):
            return False
        return any(
            not _is_link(cache / name) and (cache / name).is_file()
            for name in (RUN_MARKER, "settings.json")  # settings.json: runs before the marker
        )

    def _check_replaceable(self) -> None:
        out = self.out
        if not _is_real_dir(out) or not any(os.scandir(out)):
            return
        manifest = self._manifest()
        if manifest is not None and manifest.get("kind", "reproduce") != self.kind:
            raise IdentifiableError(
                f"--force refused: {out} holds an identifiable {manifest.get('kind')} run, and "
                f"{self.kind} --force only replaces a {self.kind} run; nothing was deleted; "
                "choose another --out"
            )
        if manifest is None:
            raise IdentifiableError(
                f"--force refused: {out} holds no identifiable run, and --force only replaces "
                "a run of ours; nothing was deleted; choose another --out"
            )
        foreign = self._foreign()
        if foreign:
            raise IdentifiableError(
                f"--force refused: {out} holds {len(foreign)} entries identifiable did not write "
                f"(e.g. {foreign[0]}); nothing was deleted; move them or choose another --out"
            )
