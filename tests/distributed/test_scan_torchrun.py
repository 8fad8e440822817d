"""`identifiable.scan` under `torchrun` (gloo, 2 ranks) against one process: the texts are
shared out through the output folder's shard cache, and the files and every rank's
returned result are those of one process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

SCRIPT = """
import hashlib, sys
import identifiable.experiments.scan as stage

stage.SHARD_TEXTS = 2  # four shards of two texts: both ranks get some
import identifiable as idf

model = idf.load_model("tiny-llama")
texts = open("texts.txt", encoding="utf-8").read().splitlines()
out = None if sys.argv[1] == "-" else sys.argv[1]
result = idf.scan(model, texts, keep=[(1, 0)], out=out, progress=False)
digest = hashlib.sha256(result.null_fraction.numpy().tobytes()).hexdigest()
print("RESULT", digest, result.kept)
"""


def _env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")  # fmt: skip
    return env


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=400, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, bert_tokenizer) -> Path:
    from helpers.families import build_tiny_hf_model

    root = tmp_path_factory.mktemp("scan-dist")
    build_tiny_hf_model("llama", attn_implementation="sdpa").save_pretrained(root / "tiny-llama")
    bert_tokenizer.save_pretrained(root / "tiny-llama")
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "while",
        "dogs",
        "and",
        "birds",
        "sang",
        "over",
        "old",
        "rivers",
        "in",
        "the",
        "city",
    ]
    texts = [" ".join(words[(3 * i) % 7 :] + words[: 5 + i]) for i in range(8)]
    (root / "texts.txt").write_text("\n".join(texts) + "\n", "utf-8")
    (root / "scan_texts.py").write_text(SCRIPT, "utf-8")
    return root


def _files(out: Path) -> dict[str, bytes]:
    return {n: (out / n).read_bytes() for n in ("scan.safetensors", "heads.csv", "summary.json")}


def test_two_ranks_give_one_process_result(workdir: Path) -> None:
    one = _run(["scan_texts.py", "one"], workdir)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                "scan_texts.py", "two"], workdir)  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    assert "Traceback" not in two.stderr
    assert _files(workdir / "two") == _files(workdir / "one")
    results = re.findall(r"RESULT .*", two.stdout)
    assert len(results) == 2 and set(results) == set(re.findall(r"RESULT .*", one.stdout))
    shards = sorted((workdir / "two" / ".cache" / "scan").glob("*.json"))
    assert len(shards) == 4  # every shard once, whichever rank computed it


def test_without_a_folder_torchrun_is_refused_in_one_line(workdir: Path) -> None:
    proc = _run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                 "scan_texts.py", "-"], workdir)  # fmt: skip
    assert proc.returncode != 0
    assert "under torchrun, scan needs out=" in proc.stderr
