"""CLI start-up: CPU seconds of `identifiable --version`, `--help` and `trace --help`
against `python -c pass` and `python -c "import torch"`, in fresh processes, interleaved.

    .venv/bin/python benchmarks/bench_startup.py [--repeats 5]

CPU time (user + system of the child) is what the target is stated in (≤ 0.5 s for
`--help` and `--version`); wall time follows the machine's load.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = str(Path(sys.executable).with_name("identifiable"))
CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "identifiable --version": [SCRIPT, "--version"],
    "identifiable --help": [SCRIPT, "--help"],
    "identifiable trace --help": [SCRIPT, "trace", "--help"],
}


def _run(cmd: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in CASES}
    for _ in range(args.repeats):
        for name, cmd in CASES.items():  # interleaved: load drifts hit every case alike
            samples[name].append(_run(cmd))
    base = statistics.median(c for c, _ in samples["python -c pass"])
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {args.repeats} fresh processes")
    print(f"{'command':32} {'CPU s':>7} {'CPU - pass':>11} {'wall s':>7}")
    for name, runs in samples.items():
        cpu = statistics.median(c for c, _ in runs)
        wall = statistics.median(w for _, w in runs)
        print(f"{name:32} {cpu:7.2f} {cpu - base:11.2f} {wall:7.2f}")


if __name__ == "__main__":
    main()
