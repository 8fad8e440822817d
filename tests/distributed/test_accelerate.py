"""`accelerate launch` of `identifiable reproduce`: two CPU processes, the same bytes as one.

README says runs launch with `torchrun` "and so `accelerate launch`": with `--multi_gpu`,
accelerate starts the processes through torch.distributed's launcher with the same
environment (RANK, WORLD_SIZE, MASTER_ADDR, ...); `reproduce --device cpu` then joins with
gloo, so the mode works on a machine without GPUs too, which this test uses. (accelerate's
`--cpu` mode starts several processes only through mpirun; README says to use torchrun there.)
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from distributed.test_torchrun import _args, _outputs, _run, single, workdir  # noqa: F401

pytestmark = pytest.mark.distributed


def test_accelerate_launch_with_two_cpu_processes_writes_the_same_bytes(
    workdir: Path,  # noqa: F811
    single: dict[str, bytes],  # noqa: F811
) -> None:
    if shutil.which("accelerate", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("accelerate is not installed (it comes with the 'lens' extra)")
    launch = [
        "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "-m", "identifiable", *_args("accel"),
    ]  # fmt: skip
    proc = _run(launch, workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    timings = json.loads((workdir / "accel" / ".cache" / "timings.json").read_text())
    assert timings["world_size"] == 2  # two processes really shared the stages
    got = _outputs(workdir / "accel")
    assert sorted(got) == sorted(single)
    differ = [name for name in single if got[name] != single[name]]
    assert not differ, f"files differ between accelerate's 2 processes and 1: {differ}"
