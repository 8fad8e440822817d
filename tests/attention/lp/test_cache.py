"""The compiled simplex engine's disk cache (`attention/lp/compiled.py`): compiled once, said so,
loaded by later processes, and keyed by all three of its source files."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from identifiable.attention.lp import compiled, kernel

_LOAD = (
    "import time\n"
    "from identifiable.attention.lp import compiled\n"
    "t = time.perf_counter()\n"
    "compiled.ensure_compiled()\n"
    "print(time.perf_counter() - t)\n"
)


def test_a_fresh_cache_compiles_once_says_so_and_later_processes_load_it(tmp_path):
    """A process with an empty cache compiles the engine and says so on stderr (a status
    line: not a TTY here); the next process loads it from that cache, silently and in a
    fraction of the time."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    command = [sys.executable, "-c", _LOAD]
    runs = [
        subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=False)
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = runs
    assert "compiling the interval engine" in first.stderr
    assert "compiling" not in second.stderr
    assert list(tmp_path.rglob("*run_chains*.nbi")), "the cache went where NUMBA_CACHE_DIR says"
    assert float(second.stdout) < 0.25 * float(first.stdout)


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


def test_the_python_side_states_the_compiled_tolerance():
    """`lp.OPT_TOL` (what the docs quote) is the kernel's own."""
    from identifiable.attention.lp import OPT_TOL

    assert OPT_TOL == kernel.OPT_TOL
