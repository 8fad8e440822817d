"""The compiled billiard walk's disk cache (`attention/billiard_cpu.py`, `store/jitcache.py`):
the folder "posterior" of identifiable's user cache. A fresh cache compiles once with a
status line; a warm one loads silently; damaged files (random bytes, an empty index) are
cleared after one warning line and rebuilt, with the same draws; a cache folder that cannot
be written is bypassed after one warning line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_RUN = (
    "import sys\n"
    "sys.path.insert(0, {tests!r})\n"
    "from helpers.traces import synthetic_trace\n"
    "from identifiable import attention_posterior\n"
    "tr = synthetic_trace(10, d_v=3, heads=1, seed=3)\n"
    "p = attention_posterior(tr, 0, 0, rows=[2, 7], samples=40, progress=False, threads=2)\n"
    "print(repr(p.mean.sum().item()), repr(p.ess.sum().item()))\n"
)


def _run(root: Path) -> tuple[str, list[str]]:
    """A small posterior in a fresh process with the user cache at `root`: (its summary
    numbers, its stderr lines)."""
    env = {**os.environ, "IDENTIFIABLE_CACHE": str(root), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", _RUN.format(tests=str(ROOT / "tests"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    return run.stdout.strip(), [line for line in run.stderr.splitlines() if line.strip()]


def _fresh(user_cache: Path, tmp_path: Path) -> Path:
    """A user cache holding the session's compiled interval engine (the posterior's
    certificates use it) and no posterior folder."""
    root = tmp_path / "cache"
    root.mkdir()
    if (user_cache / "engine").is_dir():
        shutil.copytree(user_cache / "engine", root / "engine")
    return root


def test_the_cache_compiles_once_loads_silently_and_rebuilds_damage(user_cache, tmp_path) -> None:
    """Damage here is an empty index; random bytes take the same path
    (`jitcache.loads`, tested on both in tests/attention/lp/test_cache.py)."""
    root = _fresh(user_cache, tmp_path)
    first, lines = _run(root)
    assert lines and all("compiling the posterior's billiard walk" in x for x in lines), lines
    assert "done in" in lines[-1]
    index = sorted((root / "posterior").rglob("*paths*.nbi"))
    assert len(index) == 1, "compiled into the user cache's posterior folder"
    again, lines = _run(root)
    assert again == first and lines == [], lines
    index[0].write_bytes(b"")
    damaged, lines = _run(root)
    assert damaged == first, "the same draws after the rebuild"
    assert len(lines) == 1 and "could not be read" in lines[0] and "rebuilding" in lines[0], lines
    assert index[0].exists() and index[0].stat().st_size > 0, "rebuilt"


def test_an_unwritable_cache_folder_is_bypassed_after_one_warning(tmp_path) -> None:
    """(The interval engine compiles in memory too here: HiGHS answers these small rows.)"""
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    out, lines = _run(blocked)
    warnings = [line for line in lines if "billiard walk compiles in memory" in line]
    assert len(warnings) == 1 and "$IDENTIFIABLE_CACHE" in warnings[0], lines
    assert out, "the posterior still answers"
