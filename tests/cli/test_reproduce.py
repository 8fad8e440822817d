"""`identifiable reproduce` and `identifiable view` run as a user runs them, including a real kill -9."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from identifiable.runs.reproduce import reproduce

pytestmark = pytest.mark.integration


def cli(*args: str, wait: bool = True) -> Any:
    cmd = [sys.executable, "-m", "identifiable", *args]
    # Same thread count as this process: float reductions, hence output bytes, depend on it.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    if not wait:
        return subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def model_and_corpus(
    tiny_model: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cli")
    model = tiny_model("bert")
    model.hf_model.save_pretrained(root / "tiny-bert")
    model.tokenizer.save_pretrained(root / "tiny-bert")
    rng = random.Random(0)
    words = [
        "the",
        "a",
        "cat",
        "dog",
        "river",
        "city",
        "music",
        "train",
        "people",
        "house",
        "small",
        "old",
        "new",
        "red",
        "green",
        "went",
        "saw",
        "made",
    ]

    def sentence(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(k)).capitalize() + rng.choice([".", ","])

    paragraphs = [" ".join(sentence(rng.randint(3, 9)) for _ in range(3)) + "." for _ in range(30)]
    (root / "corpus.txt").write_text("\n\n".join(paragraphs), "utf-8")
    return root / "tiny-bert", root / "corpus.txt"


def outputs(out: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and ".cache" not in p.relative_to(out).parts
    }


def test_killed_run_resumes_to_the_same_outputs(
    model_and_corpus: tuple[Path, Path], tmp_path: Path
) -> None:
    model_dir, corpus = model_and_corpus
    reference = tmp_path / "reference"
    reproduce(str(model_dir), str(corpus), reference, budget="smoke", progress=False)

    out = tmp_path / "killed"
    args = [
        "reproduce",
        "--model",
        str(model_dir),
        "--corpus",
        str(corpus),
        "--budget",
        "smoke",
        "--out",
        str(out),
    ]
    proc = cli(*args, "--no-progress", wait=False)
    # a run in progress works in a sibling folder; --out only ever holds a finished report
    first_shard = (
        out.parent / f".{out.name}.identifiable-partial" / ".cache" / "attention" / "00000.json"
    )
    deadline = time.monotonic() + 300
    while not first_shard.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.communicate()[1]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "index.html").exists()

    refused = cli(*args)
    assert (
        refused.returncode == 2
        and "--resume" in refused.stderr
        and "Traceback" not in refused.stderr
    )
    resumed = cli(*args, "--resume", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    # the estimate of what is left counts the shards the killed run finished
    said = next(x for x in resumed.stderr.splitlines() if x.startswith("resuming: "))
    finished, shards = (int(w) for w in said.split()[1:4:2])
    assert 1 <= finished < shards and "left" in said
    assert "pipeline check" in resumed.stdout  # smoke: no claim count presented as findings
    assert outputs(out) == outputs(reference)


def test_view_cli(model_and_corpus: tuple[Path, Path], tmp_path: Path) -> None:
    model_dir, _ = model_and_corpus
    out = tmp_path / "view.html"
    r = cli(
        "view",
        "The <script>alert(1)</script> cat sat.",
        "--model",
        str(model_dir),
        "--out",
        str(out),
        "--layer",
        "1",
        "--head",
        "3",
        "--max-rows",
        "2",
    )
    assert r.returncode == 0, r.stderr
    html = out.read_text("utf-8")
    assert "<script>alert" not in html and '"\\u003c","script","\\u003e","alert"' in html
    bad = cli("view", "x", "--model", str(model_dir), "--layer", "9", "--out", str(out), "--force")
    assert (
        bad.returncode == 2
        and "valid layers are 0..1" in bad.stderr
        and "Traceback" not in bad.stderr
    )
    assert out.read_text("utf-8") == html  # a failed run leaves the previous page alone
