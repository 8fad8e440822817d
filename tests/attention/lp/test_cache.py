"""The compiled engine's disk cache (`attention/lp/cache.py`, `compiled.py`): in the user's
cache directory (not the package, not NUMBA_CACHE_DIR); a cold cache answers small problems
with HiGHS while a background process compiles; later processes load it; a damaged cache
(random bytes, an empty index) is rebuilt and an unwritable one bypassed, each after one
warning line and never a traceback."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from identifiable.attention.lp import cache, compiled, kernel

ROOT = Path(__file__).resolve().parents[3]
_ROW = (
    "import sys, time\n"
    "sys.path.insert(0, {tests!r})\n"
    "from helpers.traces import synthetic_trace\n"
    "from identifiable.attention import attention_intervals\n"
    "from identifiable.attention.certificates import interval_lp\n"
    "from identifiable.attention.intervals import _row_problem\n"
    "tr = synthetic_trace(n=12, d_v=3, causal=True, seed=2)\n"
    "t = time.perf_counter()\n"
    "iv = attention_intervals(tr, 1, 0, 11, threads=1)\n"
    "took = time.perf_counter() - t\n"
    "a, seen, _, _, basis, _ = _row_problem(tr, 1, 0, 11, None)\n"
    "lo, hi, _ = interval_lp(a[seen].numpy(), basis)\n"
    "diff = max(abs(iv.lower[seen].numpy() - lo).max(), abs(iv.upper[seen].numpy() - hi).max())\n"
    "print(took, diff)\n"
)


def _run(code: str, root: Path, numba_dir: Path, timeout: int = 1200):
    env = {**os.environ, "IDENTIFIABLE_CACHE_DIR": str(root), "NUMBA_CACHE_DIR": str(numba_dir)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def _row(root: Path, numba_dir: Path) -> tuple[float, float, str]:
    run = _run(_ROW.format(tests=str(ROOT / "tests")), root, numba_dir)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    took, diff = map(float, run.stdout.split())
    return took, diff, run.stderr


def _wait_warm(root: Path, limit_s: float = 1500.0) -> None:
    t0 = time.time()
    while not list((root / "engine").glob("ready-*")) and time.time() - t0 < limit_s:
        time.sleep(1.0)
    assert list((root / "engine").glob("ready-*")), "the background compile finished"


@pytest.fixture(scope="module")
def warm_root(tmp_path_factory) -> Path:
    """A cache filled the way a first user fills it: a call on a cold cache answers with
    HiGHS at once and starts the background compile, which this waits for."""
    root = tmp_path_factory.mktemp("cache")
    numba_dir = tmp_path_factory.mktemp("numba")
    _, diff, err = _row(root, numba_dir)
    assert diff < 1e-9 and "compiling" not in err  # HiGHS answered; nothing compiled here
    _wait_warm(root)
    assert list((root / "engine").rglob("*run_chains*.nbi")), "numba's files are in our folder"
    assert not any(numba_dir.iterdir()), "NUMBA_CACHE_DIR does not move the engine's cache"
    return root


def test_a_warm_cache_loads_in_a_later_process(warm_root, tmp_path):
    _, diff, err = _row(warm_root, tmp_path)
    assert diff < 1e-9 and err == ""


def _damaged(warm_root: Path, tmp_path: Path, how: str) -> Path:
    root = tmp_path / "cache"
    shutil.copytree(warm_root, root)
    for index in (root / "engine").rglob("*run_chains*.nbi"):
        if how == "random bytes":
            index.write_bytes(os.urandom(256))
            for data in index.parent.glob("*run_chains*.nbc"):
                data.write_bytes(os.urandom(4096))
        else:
            index.write_bytes(b"")
    return root


@pytest.mark.parametrize("how", ["random bytes", "empty index"])
def test_a_damaged_cache_is_rebuilt_after_one_warning(warm_root, tmp_path, how):
    root = _damaged(warm_root, tmp_path, how)
    _, diff, err = _row(root, tmp_path)
    lines = [line for line in err.splitlines() if line.startswith("identifiable:")]
    assert diff < 1e-9 and len(lines) == 1 and "rebuilding it" in lines[0], err
    _, diff, err = _row(root, tmp_path)  # rebuilt: the next process loads it silently
    assert diff < 1e-9 and err == ""


def test_an_unwritable_cache_folder_is_bypassed_after_one_warning(tmp_path):
    """The cache folder cannot be made (a file stands where its parent should be): one
    warning line, the engine compiles in memory, the bounds are right."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    _, diff, err = _row(blocker / "cache", tmp_path)
    lines = [line for line in err.splitlines() if line.startswith("identifiable:")]
    assert diff < 1e-9 and len(lines) == 1 and "cannot be written" in lines[0], err


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
    assert compiled.highs_seconds(np.array([12] * 12), 4) < 0.1
    assert compiled.highs_seconds(np.array([512]), 129) > compiled.HIGHS_WHILE_COMPILING_S


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("IDENTIFIABLE_CACHE_DIR", str(tmp_path))
    assert cache.folder() == tmp_path / "engine"
    monkeypatch.delenv("IDENTIFIABLE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.folder() == tmp_path / "xdg" / "identifiable" / "engine"


def test_the_python_side_states_the_compiled_tolerance():
    """`lp.OPT_TOL` (what the docs quote) is the kernel's own."""
    from identifiable.attention.lp import OPT_TOL

    assert OPT_TOL == kernel.OPT_TOL
