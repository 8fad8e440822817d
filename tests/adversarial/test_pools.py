"""Worker pools under hostile settings: `--workers 100000`, and Ctrl-C while the workers
start or run. At most one process per core starts; an interrupt prints one line at any
worker count, never a worker's traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers.cli import SCRIPT
from identifiable.utils.pools import available_cores, worker_count

TEXT = "the cat sat on the mat. the dog sat on the log, and the bird sat on the cat"


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` (from /proc: each process's parent)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _is_worker(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"spawn_main" in cmdline or b"multiprocessing-fork" in cmdline


def _sigint_default() -> None:
    """In the child before it runs: Ctrl-C as a terminal gives it. A shell starts background
    jobs with SIGINT ignored, and Python keeps an inherited SIG_IGN, so without this the
    test would depend on how the suite was launched."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _certify(model_dir: Path, cwd: Path, workers: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [str(SCRIPT), "certify", TEXT, "--model", str(model_dir), "--workers", workers],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, which Ctrl-C signals as a whole
        preexec_fn=_sigint_default,
    )


def _watch_workers(proc: subprocess.Popen, until: float) -> set[int]:
    """Worker processes seen below `proc` while it runs (polled every 20 ms)."""
    seen: set[int] = set()
    while proc.poll() is None and time.monotonic() < until:
        seen |= {p for p in _descendants(proc.pid) if _is_worker(p)}
        time.sleep(0.02)
    return seen


def test_certify_with_100000_workers_starts_at_most_one_process_per_core(ws, model_dir) -> None:
    """The issue's case: `pool_plan(100000, 72, 6)` gave 72 processes on 2 cores. The tiny
    model has 8 heads; at most the cores' count of workers may start, and the map is the
    same as in one process."""
    proc = _certify(model_dir, ws.root, "100000")
    seen = _watch_workers(proc, time.monotonic() + 280)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    print(f"{len(seen)} worker processes started on {available_cores()} cores")
    assert 1 <= len(seen) <= available_cores() if available_cores() > 1 else len(seen) == 0
    assert b"Traceback" not in err


def test_ctrl_c_during_certify_with_workers_is_one_line(ws, model_dir) -> None:
    """SIGINT to the whole process group (what a terminal's Ctrl-C does) as soon as the
    workers exist, while they still import torch: one line, exit 130, and no worker left.
    (`--workers 100000` runs the same pool, bounded to the cores: the test above.)"""
    if available_cores() < 2:
        pytest.skip("one core: certify runs in one process, there are no workers to stop")
    proc = _certify(model_dir, ws.root, "2")
    deadline = time.monotonic() + 280
    workers_seen: set[int] = set()
    while len(workers_seen) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        workers_seen |= {p for p in _descendants(proc.pid) if _is_worker(p)}
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    text = err.decode()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("attention")]
    assert proc.returncode == 130 and lines == ["interrupted"], text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    assert not any(Path(f"/proc/{p}").exists() and _is_worker(p) for p in workers_seen)


POOL = """
import signal, sys, time
from identifiable.utils.pools import process_pool

def work(x):
    time.sleep(60)
    return x

if __name__ == "__main__":
    try:
        with process_pool(2) as pool:
            futures = [pool.submit(work, i) for i in range(4)]
            print("STARTED", flush=True)
            [f.result() for f in futures]
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
"""


def test_pool_workers_ignore_sigint_and_the_parent_stops_them(tmp_path) -> None:
    """A bare pool: the workers' SIGINT disposition is SIG_IGN from their start, and the
    parent's KeyboardInterrupt terminates them within seconds (their jobs sleep a minute)."""
    script = tmp_path / "pool.py"
    script.write_text(POOL)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
        preexec_fn=_sigint_default,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"STARTED\n"
    deadline = time.monotonic() + 60
    workers: set[int] = set()
    while len(workers) < 2 and time.monotonic() < deadline:
        workers = {p for p in _descendants(proc.pid) if _is_worker(p)}
        time.sleep(0.02)
    for pid in workers:  # SigIgn bit 2 (SIGINT) set in each worker from the start
        status = Path(f"/proc/{pid}/status").read_text()
        ignored = int(
            next(ln for ln in status.splitlines() if ln.startswith("SigIgn")).split()[1], 16
        )
        assert ignored & (1 << (signal.SIGINT - 1)), status
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert b"INTERRUPTED" in out and b"Traceback" not in err, err
    assert time.monotonic() - start < 20
    assert not any(Path(f"/proc/{p}").exists() for p in workers)


def test_worker_count_is_bounded_by_jobs_cores_and_memory(monkeypatch) -> None:
    import identifiable.utils.pools as pools

    monkeypatch.setattr(pools, "available_cores", lambda: 2)
    assert worker_count(100_000, jobs=72, per_worker=1, available=None) == 2
    assert worker_count(100_000, jobs=1, per_worker=1, available=None) == 1
    assert worker_count(2, jobs=8, per_worker=400, available=500) == 1  # one fits
    assert worker_count(2, jobs=8, per_worker=400, available=100) == 1  # runs here
    monkeypatch.setattr(pools, "available_cores", lambda: 64)
    assert worker_count(100_000, jobs=72, per_worker=512 << 20, available=8 << 30) == 16


def test_interval_map_threads_are_bounded_by_the_cores(monkeypatch, tiny_model) -> None:
    """`threads=100000` is accepted like `workers=100000` and runs at most one engine thread
    per core; `threads=0` is refused by the CLI's rule."""
    import identifiable.attention.intervals as intervals
    from identifiable.errors import IdentifiableError

    trace = tiny_model("bert").trace("the cat sat")
    monkeypatch.setattr(intervals, "available_cores", lambda: 3)
    request = (None, None, None, None)
    assert intervals._check_map_request(trace, 1, 100_000, *request)[1] == 3
    assert intervals._check_map_request(trace, 1, 2, *request)[1] == 2
    with pytest.raises(IdentifiableError, match=r"^threads="):
        intervals._check_map_request(trace, 1, 0, *request)


def test_probe_fits_run_at_most_one_layer_per_core(monkeypatch) -> None:
    """The probe stage's thread pool (`fit_workers`) is bounded like the process pools, and
    its `workers` is checked by the same rule."""
    import identifiable.tokens.evaluate as evaluate
    from identifiable.errors import IdentifiableError

    monkeypatch.setattr(evaluate, "available_cores", lambda: 2)
    cpu = torch.device("cpu")
    assert evaluate.fit_workers(100_000, cpu, 12) == 2
    assert evaluate.fit_workers(100_000, cpu, 1) == 1
    assert evaluate.fit_workers(None, torch.device("meta"), 12) == 1  # an accelerator: one
    with pytest.raises(IdentifiableError, match=r"^workers=0 must be at least 1$"):
        evaluate.fit_workers(0, cpu, 12)
    with pytest.raises(IdentifiableError, match=r"^workers="):
        evaluate.fit_workers(1.5, cpu, 12)
