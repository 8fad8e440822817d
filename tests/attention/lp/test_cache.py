"""The compiled engine's disk cache (`attention/lp/cache.py`, `loading.py`): the folder
"engine" of identifiable's user cache ($IDENTIFIABLE_CACHE; not the package, not
NUMBA_CACHE_DIR). A cache without its marker answers small problems with HiGHS while a
background process fills it; later processes load it silently; damaged files (random
bytes, an empty index) are cleared after one warning line and rebuilt; a folder that
cannot be written is bypassed after one. None of these tests compiles the engine: they
start from the session's warm cache (tests/conftest.py), and the rebuild after damage is
shown on a one-line cached function."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from identifiable.attention.lp import cache, compiled, kernel, loading

ROOT = Path(__file__).resolve().parents[3]
_ROW = (
    "import sys\n"
    "sys.path.insert(0, {tests!r})\n"
    "from helpers.traces import synthetic_trace\n"
    "from identifiable.attention import attention_intervals\n"
    "from identifiable.attention.certificates import interval_lp\n"
    "from identifiable.attention.intervals import _row_problem\n"
    "from identifiable.attention.lp import loading\n"
    "tr = synthetic_trace(n=12, d_v=3, causal=True, seed=2)\n"
    "iv = attention_intervals(tr, 1, 0, 11, threads=1)\n"
    "a, seen, _, _, basis, _ = _row_problem(tr, 1, 0, 11, None)\n"
    "lo, hi, _ = interval_lp(a[seen].numpy(), basis)\n"
    "diff = max(abs(iv.lower[seen].numpy() - lo).max(), abs(iv.upper[seen].numpy() - hi).max())\n"
    "print(diff, 'engine' if loading._ready else 'highs')\n"
)


def _row(root: Path, numba_dir: Path) -> tuple[float, str, list[str]]:
    """A 12-key causal row in a fresh process with the user cache at `root`: (largest
    difference from per-row LPs, the backend that answered, its warning lines)."""
    env = {**os.environ, "IDENTIFIABLE_CACHE": str(root), "NUMBA_CACHE_DIR": str(numba_dir)}
    run = subprocess.run([sys.executable, "-c", _ROW.format(tests=str(ROOT / "tests"))],
                         env=env, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    diff, backend = run.stdout.split()
    lines = run.stderr.splitlines()
    assert all(line.startswith("identifiable: ") for line in lines), run.stderr
    return float(diff), backend, lines


@pytest.fixture
def warm(user_cache: Path, tmp_path: Path) -> Path:
    """A copy of the session's warm engine cache (tests/conftest.py loaded it)."""
    engine, mark = cache.folder(), cache.marker(loading.marker_key())
    if engine is None or mark is None or not mark.exists():
        pytest.skip("the session's engine cache is not on disk (its folder cannot be written)")
    root = tmp_path / "cache"
    shutil.copytree(engine, root / cache.KIND, ignore=shutil.ignore_patterns("compiling-*"))
    return root


def _index(root: Path) -> list[Path]:
    return sorted((root / cache.KIND).rglob("*run_chains*.nbi"))


def test_a_cache_without_its_marker_is_filled_in_the_background(warm, tmp_path):
    """HiGHS answers at once; a background process loads the engine's files and writes
    the marker; a later process loads the engine silently, leaving NUMBA_CACHE_DIR empty."""
    for mark in (warm / cache.KIND).glob("ready-*"):
        mark.unlink()
    numba_dir = tmp_path / "numba"
    numba_dir.mkdir()
    stamps = [p.stat().st_mtime_ns for p in _index(warm)]
    diff, backend, lines = _row(warm, numba_dir)
    assert diff < 1e-9 and backend == "highs" and lines == []
    t0 = time.time()
    while not list((warm / cache.KIND).glob("ready-*")) and time.time() - t0 < 300:
        time.sleep(0.5)
    assert list((warm / cache.KIND).glob("ready-*")), "the background process wrote the marker"
    assert not list((warm / cache.KIND).glob("compiling-*")), "and removed its flag"
    diff, backend, lines = _row(warm, numba_dir)
    assert diff < 1e-9 and backend == "engine" and lines == []
    assert [p.stat().st_mtime_ns for p in _index(warm)] == stamps, "loaded, not compiled"
    assert not any(numba_dir.iterdir()), "NUMBA_CACHE_DIR does not move the engine's cache"


@pytest.mark.parametrize("how", ["random bytes", "empty index"])
def test_damaged_engine_files_are_cleared_after_one_warning(warm, tmp_path, how):
    """HiGHS answers the row; the damaged files are gone so that the background compile
    writes them anew (a live flag stands in for a compile already running: none starts)."""
    assert _index(warm)
    for index in _index(warm):
        if how == "random bytes":
            index.write_bytes(os.urandom(256))
            for data in index.parent.glob("*run_chains*.nbc"):
                data.write_bytes(os.urandom(4096))
        else:
            index.write_bytes(b"")
    (warm / cache.KIND / f"compiling-{compiled.STAMP[:16]}").write_text(str(os.getpid()))
    diff, backend, lines = _row(warm, tmp_path)
    assert diff < 1e-9 and backend == "highs", lines
    assert len(lines) == 1 and "could not be read" in lines[0] and "rebuilding" in lines[0]
    assert not _index(warm) and not list((warm / cache.KIND).glob("ready-*"))


def _tiny_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("how", ["random bytes", "empty index"])
def test_damaged_files_are_rebuilt_and_load_again(monkeypatch, tmp_path, capfd, how):
    """What `cache.loads` does with numba's own files, on a one-line function cached the
    engine's way: written into our folder; damaged, refused after one warning line and
    cleared; compiled anew; then loaded from disk by a fresh dispatcher."""
    monkeypatch.setenv("IDENTIFIABLE_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "tiny_engine.py"
    source.write_text("from identifiable.attention.lp.cache import cached\n\n\n"
                      "@cached()\ndef double(x):\n    return 2.0 * x\n")  # fmt: skip
    fresh = iter(f"tiny_engine_{how.replace(' ', '_')}_{i}" for i in range(4))
    first = _tiny_module(source, next(fresh))
    assert cache.loads(lambda: first.double(1.5)) and first.double.stats.cache_misses
    index = list((tmp_path / "cache" / cache.KIND).rglob("*double*.nbi"))
    assert len(index) == 1
    index[0].write_bytes(os.urandom(256) if how == "random bytes" else b"")
    capfd.readouterr()
    damaged = _tiny_module(source, next(fresh))
    assert not cache.loads(lambda: damaged.double(1.5))
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 1 and "could not be read" in lines[0], lines
    assert not index[0].exists(), "the damaged files are cleared"
    rebuilt = _tiny_module(source, next(fresh))
    assert cache.loads(lambda: rebuilt.double(1.5)) and index[0].exists()
    later = _tiny_module(source, next(fresh))
    assert later.double(1.5) == 3.0 and later.double.stats.cache_hits, "loaded from disk"
    assert capfd.readouterr().err == ""


def test_an_unwritable_cache_folder_is_bypassed_after_one_warning(tmp_path):
    """The cache folder cannot be made (a file stands where it should be): one warning
    line that names $IDENTIFIABLE_CACHE, and HiGHS answers while nothing is compiled."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    diff, backend, lines = _row(blocker / "cache", tmp_path)
    assert diff < 1e-9 and backend == "highs"
    assert len(lines) == 1 and "$IDENTIFIABLE_CACHE" in lines[0], lines
    assert "compiles in memory" in lines[0]


def test_the_cache_key_covers_every_source_file():
    """numba keys a cached function by its own bytecode and file only; `run_chains` closes
    over the hash of every file compiled into it, so that an edit to any of them compiles
    anew."""
    names = {Path(f).name for f in compiled.SOURCES}
    assert names == {"lockstep.py", "kernel.py", "panels.py", "state.py", "compiled.py"}
    digest = hashlib.sha256(b"".join(Path(f).read_bytes() for f in compiled.SOURCES)).hexdigest()
    assert compiled.sources_hash() == digest
    closure = compiled.run_chains.py_func.__closure__ or ()
    assert digest in [cell.cell_contents for cell in closure]


def test_highs_answers_only_what_it_does_in_seconds():
    assert loading.highs_seconds(np.array([12] * 12), 4) < 0.1
    assert loading.highs_seconds(np.array([512]), 129) > loading.HIGHS_WHILE_COMPILING_S


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("IDENTIFIABLE_CACHE", str(tmp_path / "mine"))
    assert cache.folder() == tmp_path / "mine" / "engine"
    monkeypatch.delenv("IDENTIFIABLE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.folder() == tmp_path / "xdg" / "identifiable" / "engine"


def test_the_python_side_states_the_compiled_tolerance():
    """`lp.OPT_TOL` (what the docs quote) is the kernel's own."""
    from identifiable.attention.lp import OPT_TOL

    assert OPT_TOL == kernel.OPT_TOL


def test_the_marker_follows_the_time_stamps_numba_checks(monkeypatch, tmp_path):
    """numba's index is keyed by its source file's time stamp and size: a reinstall that
    rewrites the same sources makes numba compile anew, so the marker's key changes with
    them (the cache counts as cold, and the compile is announced or done in the
    background), while the same files give the same key."""
    before = loading.marker_key()
    assert loading.marker_key() == before
    copy = tmp_path / "crossover.py"
    shutil.copy2(loading.crossover.__file__, copy)
    monkeypatch.setattr(loading.crossover, "__file__", str(copy))
    assert loading.marker_key() == before, "same time stamp and size, same key"
    os.utime(copy, (time.time(), time.time() + 5))
    assert loading.marker_key() != before
