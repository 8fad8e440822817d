"""README's five-minute tour runs verbatim, in a fresh interpreter, in ≤ 120 s of wall time.

The python code blocks of the section "A five-minute tour" (to the next `## ` heading) are
written to a file as they stand and executed by a fresh `python`, in an empty folder,
offline, with CI's thread count. The numbers the tour's comments state are then read from
the tour's own variables. If the tour grows past the bound, shorten the tour, not the test.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
WALL_LIMIT_S = 120.0

CHECK = """
import json, runpy, sys
ns = runpy.run_path(sys.argv[1], run_name="__main__")
tr, ns_ = ns["trace"], ns["ns"]
print("TOUR-CHECK " + json.dumps({
    "repr": repr(ns["model"]),
    "tokens": tr.n_tokens,
    "dim": int(ns_.dim[0, 0, -1]),
    "dim_stochastic": int(ns_.dim_stochastic[0, 0, -1]),
    "verify": float(tr.verify().max()),
}))
"""


def tour_source(text: str) -> str:
    """The tour's python blocks, in order, exactly as README has them."""
    start = text.index("\n## A five-minute tour")
    end = text.index("\n## ", start + 5)
    blocks = re.findall(r"```python\n(.*?)```", text[start:end], re.S)
    assert len(blocks) >= 2, "the tour lost its code blocks"
    return "\n".join(blocks)


def test_the_tour_source_is_what_readme_shows() -> None:
    source = tour_source(README.read_text("utf-8"))
    assert source.startswith("import identifiable as idf\n")
    assert 'idf.load_model("minilm")' in source and "viewer_iframe" in source
    compile(source, "README tour", "exec")  # every block is valid Python on its own terms


def test_the_readme_tour_runs_verbatim_within_two_minutes(tmp_path: Path) -> None:
    tour = tmp_path / "tour.py"
    tour.write_text(tour_source(README.read_text("utf-8")), "utf-8")
    check = tmp_path / "check.py"
    check.write_text(CHECK, "utf-8")
    env = {
        **os.environ,
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "2",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(check), str(tour)], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (usage.ru_utime - cpu_before.ru_utime) + (usage.ru_stime - cpu_before.ru_stime)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("TOUR-CHECK "))
    got = json.loads(line.removeprefix("TOUR-CHECK "))
    # what the tour's comments say
    assert got["repr"] == (
        "Model('minilm', family='bert', layers=6, heads=12, head_dim=32, dtype=float32, device=cpu)"
    )
    assert got["tokens"] == 51 and got["dim"] == 19 and got["dim_stochastic"] == 18
    assert got["verify"] < 1e-5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["check.py", "tour.py"], (
        "the tour wrote files into its folder"
    )
    load = os.getloadavg()[0]
    print(f"README tour: {wall:.1f} s wall, {cpu:.1f} s CPU, load average {load:.1f}")
    assert wall <= WALL_LIMIT_S, (
        f"the README tour took {wall:.0f} s of wall time (limit {WALL_LIMIT_S:.0f} s; "
        f"{cpu:.0f} s of CPU, load average {load:.1f}): shorten the tour"
    )
