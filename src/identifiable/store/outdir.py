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

Symbolic links are never followed: every walk uses `lstat` and nothing is removed through a
link. A manifest that cannot be read (missing, malformed, nested 200k deep) vouches for
nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
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
from identifiable.store.places import check_place, probe_writable
from identifiable.store.places import exists as _exists
from identifiable.store.places import is_link as _is_link
from identifiable.store.places import is_real_dir as _is_real_dir
from identifiable.store.places import refused_location as _refused_location

CACHE = ".cache"
MANIFEST = "manifest.json"  # inside CACHE
RUN_MARKER = "run.json"  # inside CACHE: written first, so a killed run is known as ours
_FORMAT = 1


def _partial(out: Path) -> Path:
    return out.parent / f".{out.name}.identifiable-partial"


def _lockfile(out: Path) -> Path:
    return out.parent / f".{out.name}.identifiable.lock"


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


class OutputFolder:
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
                            _remove_tree(work)
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
            try:
                if self.resume and self._is_ours():
                    _link_tree(out / CACHE, work / CACHE)
                self._mark(work)
            except BaseException:  # a full disk: leave no half-made work folder behind
                with contextlib.suppress(OSError):
                    _remove_tree(work)
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
