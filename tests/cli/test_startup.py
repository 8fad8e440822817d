"""The CLI starts without the numerical stack: `--help`, `--version` and every command's
`--help` import neither torch, numpy, pandas nor transformers (together 2 s of CPU before
this check existed; `benchmarks/bench_startup.py` measures the start-up against
`python -c pass`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from identifiable.cli import COMMAND_MODULES

HEAVY = ("torch", "numpy", "pandas", "transformers", "matplotlib", "scipy")

PROBE = """
import sys
{preimport}
from identifiable.cli import main
for argv in {runs!r}:
    try:
        main(argv)
    except SystemExit:
        pass
print("HEAVY:" + ",".join(m for m in {heavy!r} if m in sys.modules))
"""


def _heavy_after(runs: list[list[str]], preimport: str = "") -> list[str]:
    code = PROBE.format(preimport=preimport, runs=runs, heavy=HEAVY)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    ).stdout
    lines = [x for x in out.splitlines() if x.startswith("HEAVY:")]
    assert lines, out
    return [m for m in lines[-1].removeprefix("HEAVY:").split(",") if m]


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_top_level_start_imports_no_numerical_stack(argv: list[str]) -> None:
    assert _heavy_after([argv]) == []


def test_every_command_help_imports_no_numerical_stack() -> None:
    assert _heavy_after([[command, "--help"] for command in COMMAND_MODULES]) == []


def test_the_probe_sees_a_heavy_import() -> None:
    # the check can fail: a process that imports torch is reported as such
    assert "torch" in _heavy_after([["--version"]], preimport="import torch")
