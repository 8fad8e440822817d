"""`torchrun` runs of `identifiable reproduce` (gloo, 2 ranks) against one process.

Each run is a real subprocess, as a user launches it: `python -m torch.distributed.run`
(the `torchrun` script) with `-m identifiable`. Every process uses one thread, so the only
difference between the runs is how the shards are shared out, which must not change a byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.corpora import small_corpus

pytestmark = pytest.mark.distributed

OUTPUTS = ("index.html", "summary.json", "figures", "tables")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def _run(args: list[str], cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _torchrun(nproc: int, target: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return _run(
        ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *target], cwd
    )


def _outputs(out: Path) -> dict[str, bytes]:
    files = {}
    for name in OUTPUTS:
        root = out / name
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        files.update({str(p.relative_to(out)): p.read_bytes() for p in paths})
    return files


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, bert_tokenizer) -> Path:
    """A saved tiny BERT (with the embedded tokenizer) and a small text corpus."""
    from helpers.families import build_tiny_hf_model

    root = tmp_path_factory.mktemp("dist")
    model_dir = root / "tiny-bert"
    build_tiny_hf_model("bert").save_pretrained(model_dir)
    bert_tokenizer.save_pretrained(model_dir)
    lines = [f"{a} {b}" for a, b in small_corpus(48)]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n", "utf-8")
    return root


def _args(out: str, *extra: str) -> list[str]:
    return [
        "reproduce",
        "--model",
        "tiny-bert",
        "--corpus",
        "corpus.txt",
        "--budget",
        "smoke",
        "--out",
        out,
        "--no-progress",
        *extra,
    ]


@pytest.fixture(scope="module")
def single(workdir: Path) -> dict[str, bytes]:
    proc = _run(["-m", "identifiable", *_args("one")], workdir)
    assert proc.returncode == 0, proc.stderr
    files = _outputs(workdir / "one")
    assert "summary.json" in files and any(k.startswith("tables/") for k in files)
    return files


def test_two_ranks_write_the_same_bytes_as_one(workdir: Path, single: dict[str, bytes]) -> None:
    proc = _torchrun(2, ["-m", "identifiable", *_args("two")], workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stdout.count("report: ") == 1  # one rank prints the summary line
    two = _outputs(workdir / "two")
    assert sorted(two) == sorted(single)
    differ = [name for name in single if two[name] != single[name]]
    assert not differ, f"files differ between 1 and 2 ranks: {differ}"
    # both ranks really computed shards: the cache holds every shard exactly once
    manifests = list((workdir / "two" / ".cache").glob("*/*.json"))
    assert len(manifests) >= 4
    timings = json.loads((workdir / "two" / ".cache" / "timings.json").read_text())
    assert timings["world_size"] == 2


def _shard_stamps(root: Path, name: str) -> dict[str, int]:
    """(stage/shard manifest → mtime) of a run's cache, wherever the unfinished run keeps it
    (the output folder, or the hidden sibling an unfinished run works in)."""
    stamps = {}
    for cache in [root / name / ".cache", *root.glob(f".{name}*/.cache")]:
        for p in cache.glob("*/*.json"):
            stamps[str(p.relative_to(cache))] = p.stat().st_mtime_ns
    return stamps


KILLER = """
import os, signal, sys
import torch.distributed as dist
import identifiable.experiments.stages as stages

real = stages.attribution_shard_tables

def killed_on_rank_1(*args, **kwargs):
    if os.environ.get("RANK") == "1":
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no message: a crashed node
    return real(*args, **kwargs)

stages.attribution_shard_tables = killed_on_rank_1
# the Python API under a process group the caller initialised itself
dist.init_process_group("gloo")
import identifiable
identifiable.reproduce("tiny-bert", "corpus.txt", "killed", budget="smoke", progress=False)
"""


def test_killed_rank_then_resume_on_one_rank_gives_identical_outputs(
    workdir: Path, single: dict[str, bytes]
) -> None:
    (workdir / "killer.py").write_text(KILLER, "utf-8")
    proc = _torchrun(2, ["killer.py"], workdir)
    assert proc.returncode != 0
    out = workdir / "killed"
    assert not (out / "index.html").exists()
    before = _shard_stamps(workdir, "killed")
    assert before, "no shard was finished before the kill"
    # resume with a different world size: shards do not depend on it
    resumed = _run(["-m", "identifiable", *_args("killed", "--resume")], workdir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = _shard_stamps(workdir, "killed")
    unchanged = {k: v for k, v in after.items() if k in before}
    assert unchanged == before, "a shard finished before the kill was computed again"
    assert len(after) > len(before)
    files = _outputs(out)
    assert sorted(files) == sorted(single)
    assert [n for n in single if files[n] != single[n]] == []


def test_an_unreachable_rendezvous_is_one_line(workdir: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _env() | {
        "WORLD_SIZE": "2",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "IDENTIFIABLE_DIST_TIMEOUT": "3",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "identifiable", *_args("nowhere")],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert f"cannot join the process group at 127.0.0.1:{port}" in lines[0]
    assert not (workdir / "nowhere").exists()
