"""The writing half of an output folder's rules (`store.outdir`): one run as a transaction.

`run()` takes an exclusive lock (`fcntl.flock` on the sibling `.DIR.identifiable.lock`),
checks the folder again under it, and works in the sibling `.DIR.identifiable-partial`
(marked `.cache/run.json` at once; a resumed run reuses it, or hard-links a finished run's
cache into it). On success the work folder gets its manifest and is swapped in for DIR
with one atomic `renameat2(RENAME_EXCHANGE)` (two renames where the kernel lacks it); the
previous run is then deleted only where its manifest vouches for it (`store.manifest`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from identifiable.errors import IdentifiableError
from identifiable.store.manifest import (
    CACHE,
    RUN_MARKER,
    link_tree,
    remove_run,
    remove_tree,
    write_manifest,
)
from identifiable.store.outdir_checks import FolderChecks, _lockfile
from identifiable.store.places import exists as _exists
from identifiable.store.places import is_link as _is_link
from identifiable.store.places import is_real_dir as _is_real_dir

_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


class FolderRun(FolderChecks):
    """`run()` of `OutputFolder`: lock, work folder, manifest and swap."""

    # ---- the run ---------------------------------------------------------------
    @contextlib.contextmanager
    def run(self, check_settings: Callable[[Path], None] | None = None) -> Iterator[Path]:
        """Lock, prepare the work folder, yield it; on success swap it in for `out`.

        `check_settings(folder)` is called with the folder whose `.cache` a resumed run
        would reuse, before anything is written, so that a refused resume changes nothing.
        Temporary files a killed writer left in the work folder are removed before the
        manifest is written, so none survives into the finished folder.
        """
        from identifiable.store.files import remove_temporaries, retry_advice

        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise IdentifiableError(
                f"cannot write to output folder {self.out}: {err.strerror or err}; choose another --out"
            ) from None
        advice = (
            "rerun the same command with --resume (finished parts are kept)"
            if self.resumable
            else "rerun the same command"
        )
        with self._lock(), retry_advice(advice):
            self._locked = True
            try:
                self.check()  # again, under the lock: the folder may have changed meanwhile
                work = self._prepare(check_settings)
                try:
                    yield work
                except BaseException:
                    if not self.resumable:  # nothing to resume: leave no work folder behind
                        with contextlib.suppress(OSError):
                            remove_tree(work)
                    raise
                remove_temporaries(work)
                write_manifest(work, self.kind)
                self._swap_in(work)
            finally:
                self._locked = False

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        path = _lockfile(self.out)
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as err:
                raise IdentifiableError(
                    f"cannot write to output folder {self.out}: {err.strerror or err}; "
                    "choose another --out"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise IdentifiableError(
                    f"another identifiable run is writing to {self.out}; wait for it to finish "
                    "or choose another --out"
                ) from None
            # The file may have been unlinked by a run finishing between our open and flock:
            # then we locked an orphan; take the lock again on the file now at `path`.
            try:
                same = os.path.samestat(os.fstat(fd), os.lstat(path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        try:
            os.write(fd, f"{os.getpid()}\n".encode())
            yield
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
            os.close(fd)

    def _prepare(self, check_settings: Callable[[Path], None] | None) -> Path:
        work, out = self.partial, self.out
        try:
            if (self.force or not self.resumable) and _exists(work):
                remove_tree(work)  # an earlier interrupted run of ours (checked in check())
            if self.resume and self._partial_is_ours():
                for name in (CACHE, "figures", "tables"):
                    if _is_link(work / name):
                        raise IdentifiableError(
                            f"{work / name} is a symbolic link; identifiable never writes through "
                            "links: remove it, then rerun with --resume"
                        )
                if check_settings is not None:
                    check_settings(work)
                return work
            if self.resume and self._is_ours() and check_settings is not None:
                check_settings(out)
            if _exists(work):  # empty leftover
                os.rmdir(work)
            os.mkdir(work)
            try:
                if self.resume and self._is_ours():
                    link_tree(out / CACHE, work / CACHE)
                self._mark(work)
            except BaseException:  # a full disk: leave no half-made work folder behind
                with contextlib.suppress(OSError):
                    remove_tree(work)
                raise
            return work
        except OSError as err:
            raise IdentifiableError(
                f"cannot write to output folder {out}: {err.strerror or err}; choose another --out"
            ) from None

    def _mark(self, work: Path) -> None:
        """Say in the work folder that it is ours (and which command's), so that an
        interrupted run is recognised as one even before it wrote anything else."""
        from identifiable.store.files import atomic_write_text

        (work / CACHE).mkdir(exist_ok=True)
        marker = {"writer": "identifiable", "kind": self.kind}
        atomic_write_text(work / CACHE / RUN_MARKER, json.dumps(marker, sort_keys=True))

    def _swap_in(self, work: Path) -> None:
        out = self.out
        try:
            if not _exists(out) or (_is_real_dir(out) and not any(os.scandir(out))):
                os.replace(work, out)  # replaces a missing or empty folder atomically
                return
            if not self._is_ours() or self._foreign():
                raise IdentifiableError(
                    f"{out} changed during the run and now holds files identifiable did not "
                    f"write; the new report is in {work}"
                )
            if _exchange(work, out):
                remove_run(work)  # the previous run, now at the work path
                return
            old = out.parent / f".{out.name}.identifiable-old"
            if _exists(old):
                remove_run(old)
            os.rename(out, old)
            os.rename(work, out)
            remove_run(old)
        except OSError as err:
            raise IdentifiableError(
                f"cannot move the finished report into {out}: {err.strerror or err}; "
                f"it is complete in {work}"
            ) from None
