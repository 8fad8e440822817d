"""The life cycle of a report folder (`reproduce --out DIR`): nothing lost, nothing foreign deleted.

Rules, in the order a run meets them:

1. `check()` is read-only and runs before anything is loaded: the folder must not be the
   filesystem root, the home directory, the current directory or one of its ancestors,
   nor a symbolic link; a non-empty folder needs `--resume` or `--force`, and `--force`
   only ever replaces a run of ours (see 3).
2. `run()` (after the model, corpus and device were validated) takes an exclusive lock
   (`fcntl.flock` on the sibling `.DIR.identifiable.lock`), so a second run into the same
   folder refuses with one line, and works in the sibling folder `.DIR.identifiable-partial`:
   the shard cache and then the report are written there, never through the old folder.
   A run that fails or is interrupted leaves that folder for `--resume` and the previous
   report in DIR untouched.
3. On success the work folder gets a manifest (`.cache/manifest.json`: size and SHA-256 of
   every file, and every folder) and is swapped in for DIR with one atomic
   `renameat2(RENAME_EXCHANGE)` (two renames where the kernel lacks it). The previous run is
   then deleted entry by entry, and only the entries its own manifest lists with unchanged
   content; a folder holding anything else (a file we did not write, an edited page, a
   symbolic link) is never deleted and `--force` refuses it up front.

Symbolic links are never followed: every walk uses `lstat` and nothing is removed through a
link.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from identifiable.errors import IdentifiableError

CACHE = ".cache"
MANIFEST = "manifest.json"  # inside CACHE
_FORMAT = 1


def _partial(out: Path) -> Path:
    return out.parent / f".{out.name}.identifiable-partial"


def _lockfile(out: Path) -> Path:
    return out.parent / f".{out.name}.identifiable.lock"


def _is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _exists(path: Path) -> bool:
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


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


def write_manifest(root: Path) -> dict[str, Any]:
    """Record every file (size, SHA-256) and folder under `root` in `root/.cache/manifest.json`."""
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
    manifest = {"format": _FORMAT, "writer": "identifiable", "files": files, "dirs": sorted(dirs)}
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
    except (OSError, ValueError):
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


def _remove_tree(root: Path) -> None:
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
    _remove_tree(root)


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


def _refused_location(out: Path) -> str | None:
    resolved = Path(os.path.realpath(out))
    if resolved == Path(resolved.anchor):
        return "the filesystem root"
    with contextlib.suppress(RuntimeError, KeyError):
        if resolved == Path(os.path.realpath(Path.home())):
            return "your home directory"
    cwd = Path(os.path.realpath(Path.cwd()))
    if resolved == cwd:
        return "the current directory"
    if resolved in cwd.parents:
        return "an ancestor of the current directory"
    return None


class OutputFolder:
    """A report folder and the rules for writing it (see the module docstring).

    `check()` before loading anything; then `with folder.run(check_settings) as work:`
    write everything into `work`; on a clean exit it becomes `out`.
    """

    def __init__(self, out: str | Path, *, resume: bool = False, force: bool = False) -> None:
        self.out = Path(out)
        self.resume = resume
        self.force = force
        self.partial = _partial(self.out)

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
        if str(out) == "" or out.name in ("", ".", ".."):
            where = _refused_location(out) or "not a folder name"
            raise IdentifiableError(
                f"--out {str(out)!r} is {where}; name a new folder for the report"
            )
        refused = _refused_location(out)
        if refused:
            raise IdentifiableError(
                f"--out {out} is {refused}; a report folder must be a folder of its own"
            )
        if _is_link(out):
            raise IdentifiableError(
                f"--out {out} is a symbolic link; pass the folder it points to "
                f"({os.path.realpath(out)}) or another --out"
            )
        if _exists(out) and not _is_real_dir(out):
            raise IdentifiableError(f"--out {out} is a file; choose a folder")
        if _exists(self.partial) and not _is_real_dir(self.partial):
            raise IdentifiableError(
                f"{self.partial} is in the way (not a folder we wrote); move it or choose another --out"
            )
        interrupted = self._partial_is_ours()
        if _exists(self.partial) and not interrupted and not self._partial_is_empty():
            raise IdentifiableError(
                f"{self.partial} holds files identifiable did not write; move it or choose another --out"
            )
        if self.force:
            self._check_replaceable()
            return
        if self.resume:
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
            return  # nothing to resume: a fresh run
        if interrupted:
            raise IdentifiableError(
                f"a run into {out} was interrupted (its work is in {self.partial}): pass --resume "
                "to continue it, --force to start over, or choose another --out"
            )
        if _is_real_dir(out) and any(os.scandir(out)):
            if self._is_ours():
                raise IdentifiableError(
                    f"output folder {out} is not empty (it holds a finished run): pass --resume "
                    "to reuse it, --force to replace it, or choose another --out"
                )
            raise IdentifiableError(
                f"output folder {out} is not empty and holds no identifiable run: choose another "
                "--out (--resume and --force only work on a run of ours)"
            )

    def _is_ours(self) -> bool:
        return _is_real_dir(self.out) and read_manifest(self.out) is not None

    def _foreign(self) -> list[str]:
        manifest = read_manifest(self.out)
        return foreign_entries(self.out, manifest) if manifest is not None else []

    def _partial_is_empty(self) -> bool:
        return _is_real_dir(self.partial) and not any(os.scandir(self.partial))

    def _partial_is_ours(self) -> bool:
        cache = self.partial / CACHE
        return (
            _is_real_dir(self.partial)
            and _is_real_dir(cache)
            and not _is_link(cache / "settings.json")
            and (cache / "settings.json").is_file()
        )

    def _check_replaceable(self) -> None:
        out = self.out
        if not _is_real_dir(out) or not any(os.scandir(out)):
            return
        if not self._is_ours():
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

    # ---- the run ---------------------------------------------------------------
    @contextlib.contextmanager
    def run(self, check_settings: Callable[[Path], None] | None = None) -> Iterator[Path]:
        """Lock, prepare the work folder, yield it; on success swap it in for `out`.

        `check_settings(folder)` is called with the folder whose `.cache` a resumed run
        would reuse, before anything is written, so that a refused resume changes nothing.
        """
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise IdentifiableError(
                f"cannot write to output folder {self.out}: {err.strerror or err}; choose another --out"
            ) from None
        with self._lock():
            self.check()  # again, under the lock: the folder may have changed meanwhile
            work = self._prepare(check_settings)
            yield work
            write_manifest(work)
            self._swap_in(work)

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
            if self.force and _exists(work):
                _remove_tree(work)  # an earlier interrupted run of ours (checked in check())
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
            if self.resume and self._is_ours():
                _link_tree(out / CACHE, work / CACHE)
            return work
        except OSError as err:
            raise IdentifiableError(
                f"cannot write to output folder {out}: {err.strerror or err}; choose another --out"
            ) from None

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


def _link_tree(src: Path, dst: Path) -> None:
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
