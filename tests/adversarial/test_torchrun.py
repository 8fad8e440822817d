"""Under torchrun (gloo, 2 ranks): an up-front refusal is named by rank 0, and the other
rank never advises --resume, whether it was waiting for rank 0 or stopped by the launcher
(before: "rerun with --resume to finish the missing shards" when nothing had started)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.distributed


def test_an_up_front_refusal_under_torchrun_never_advises_resume(ws, model_dir) -> None:
    (ws.root / "busy").mkdir()
    (ws.root / "busy" / "notes.txt").write_text("the user's")
    (ws.root / "corpus.txt").write_text("A sentence about a cat. Another about a dog.\n" * 20)
    before = ws._state()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    args = ["-m", "identifiable", "reproduce", "--model", str(model_dir), "--corpus",
            "corpus.txt", "--budget", "smoke", "--out", "busy", "--no-progress"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         *args],
        cwd=ws.root, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert any("holds no identifiable reproduce run" in line for line in ours), proc.stderr
    assert len(ours) <= 2, ours  # rank 0's refusal, and at most one line from rank 1
    assert "--resume" not in "\n".join(ours).replace("--resume and --force only work", "")
    assert "report: " not in proc.stdout  # no summary line: nothing ran
    assert ws._state() == before  # nothing written: no work folder, no lock
