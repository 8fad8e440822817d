"""Runs that finish (or are killed) with hostile settings: seeds at the top of the documented
range, a short-context model, a full disk, a kill before the end. Each through the real
entry point; the probes of `tokens` are cut to one kind so a run takes seconds."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path

import pytest

from identifiable.store.files import is_temporary
from identifiable.utils.seeds import SEED_MAX, layer_seed, offset_seed

CORPUS = "\n".join(
    f"Sentence number {i} tells of a {w} that crossed the old river at dawn."
    for i, w in enumerate(["cat", "dog", "fox", "crow", "mule", "hare"] * 6)
)


@pytest.fixture
def fast_probes(monkeypatch):
    """`tokens` with one probe kind (linear, cos) and no control or cross-layer fits: the
    seeds, splits and folders are the real ones, the fitting takes seconds."""
    import identifiable.experiments.tokens as experiment

    real = experiment.evaluate_pairs

    def fast(pairs, **kwargs):
        kwargs.update(probe_kinds=("linear",), objectives=("cos",), cross_layer=(), controls=())
        return real(pairs, **kwargs)

    monkeypatch.setattr(experiment, "evaluate_pairs", fast)


@pytest.fixture
def corpus(ws) -> Path:
    path = ws.root / "corpus.txt"
    path.write_text(CORPUS, "utf-8")
    return path


def _tokens(model: Path, corpus: Path, out: str, *extra: str) -> list[str]:
    return ["tokens", "--model", str(model), "--corpus", str(corpus), "--max-tokens", "200",
            "--layers", "1", "--out", out, *extra]  # fmt: skip


def _no_temporaries(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if is_temporary(p.name)]


# ---- seeds -----------------------------------------------------------------------------------


def test_layer_seeds_stay_in_range_and_keep_the_old_values() -> None:
    assert layer_seed(0, 3) == 3 and layer_seed(7, 2) == 7 * 1_000_003 + 2  # earlier runs
    for seed in (20_000_000_000_000, SEED_MAX, SEED_MAX // 1_000_003 + 1):
        seeds = {layer_seed(seed, layer) for layer in range(13)}
        assert len(seeds) == 13 and all(0 <= s <= SEED_MAX for s in seeds)
        assert layer_seed(seed, 5) == layer_seed(seed, 5)  # deterministic
    import torch

    torch.Generator().manual_seed(layer_seed(SEED_MAX, 12) + 17)  # the offsets fitting adds


def test_sequence_seeds_stay_in_range_and_keep_the_old_values() -> None:
    """The probe seed of sequence s (`seed + s`) at the top of the range: wrapped into
    0..SEED_MAX, which HTA accepts (it was refused as 2**63 on a resumed reproduction)."""
    assert offset_seed(7, 3) == 10 and offset_seed(SEED_MAX - 1, 1) == SEED_MAX
    seeds = {offset_seed(SEED_MAX, s) for s in range(50)}
    assert len(seeds) == 50 and all(0 <= s <= SEED_MAX for s in seeds)


@pytest.mark.parametrize("seed", [20_000_000_000_000, SEED_MAX])
def test_tokens_runs_with_a_seed_at_the_top_of_the_range(
    ws, model_dir, corpus, fast_probes, seed
) -> None:
    """The issue's case: `--seed 20000000000000` ended in "Overflow when unpacking long long"."""
    outcome = ws.main(_tokens(model_dir, corpus, "t", "--seed", str(seed)))
    assert outcome.code == 0, outcome.err
    settings = json.loads((ws.root / "t" / "tokens_settings.json").read_text())
    assert settings["settings"]["seed"] == seed
    manifest = json.loads((ws.root / "t" / ".cache" / "manifest.json").read_text())
    assert manifest["kind"] == "tokens" and "tokens_per_layer.csv" in manifest["files"]
    assert _no_temporaries(ws.root) == []


def test_tokens_force_replaces_its_own_run_and_reuses_the_cache(
    ws, model_dir, corpus, fast_probes
) -> None:
    args = _tokens(model_dir, corpus, "t", "--cache-dir", "cache")
    first = ws.main(args)
    assert first.code == 0, first.err
    ws.refused(args, "pass --force to replace it")  # a finished run is not replaced unasked
    (ws.root / "t" / "notes.txt").write_text("the user's")
    ws.refused([*args, "--force"], "--force refused")  # not over a file we did not write
    (ws.root / "t" / "notes.txt").unlink()
    again = ws.main([*args, "--force"])
    assert again.code == 0, again.err
    assert sorted(p.name for p in (ws.root / "cache").iterdir()) == sorted(
        p.name for p in (ws.root / "cache").glob("token-pairs-*")
    )
    assert not list(ws.root.glob(".t.identifiable*"))  # no work folder or lock left


# ---- a model with a short context: one truncation line ----------------------------------------


@pytest.fixture(scope="module")
def short_context(tiny_model, tmp_path_factory) -> Path:
    """A tiny BERT that takes 24 positions: the pairs of LONG_LINES are longer."""
    from transformers import AutoModel

    from helpers.families import build_tiny_hf_model

    hf = build_tiny_hf_model("bert")
    hf.config.max_position_embeddings = 24
    root = tmp_path_factory.mktemp("short") / "short-bert"
    small = AutoModel.from_config(hf.config)
    small.save_pretrained(root)
    tiny_model("bert").tokenizer.save_pretrained(root)
    return root


LONG_LINES = "\n".join(
    f"Line {i} begins with a long sentence about the {w} who walked along the river bank "
    f"for many hours. Then a second sentence follows, telling how the {w} found the old "
    "bridge and crossed it before the night came down over the quiet valley."
    for i, w in enumerate(["cat", "dog", "fox", "crow", "mule", "hare"] * 4)
)


def test_a_short_context_model_prints_one_truncation_line(ws, short_context, fast_probes) -> None:
    ws.inputs.append(short_context)
    corpus = ws.root / "long.txt"
    corpus.write_text(LONG_LINES, "utf-8")
    outcome = ws.main(_tokens(short_context, corpus, "t"))
    assert outcome.code == 0, outcome.err
    lines = [line for line in outcome.err_lines if "truncated" in line or "dropped" in line]
    assert len(lines) == 1, outcome.err
    assert lines[0].startswith("warning: ") and "texts were longer than the model takes" in lines[0]


# ---- a full disk: advice each command can follow ---------------------------------------------


@pytest.fixture
def full_disk(monkeypatch):
    """Every write of our atomic writer fails with ENOSPC."""
    from identifiable.store import files

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "_raw_write", full)


FULL_DISK = [
    (["view", "The cat sat.", "--no-certify", "--out", "v.html"], "v.html"),
    (["trace", "The cat sat.", "--json", "t.json"], "t.json"),
    (["mixing", "The cat sat.", "--json", "m.json"], "m.json"),
    (["attribution", "The cat sat.", "--probes", "2", "--json", "a.json"], "a.json"),
    (["attention", "The cat sat.", "--json", "x.json"], "x.json"),
]


@pytest.mark.parametrize(("args", "target"), FULL_DISK, ids=[a[0] for a, _ in FULL_DISK])
def test_a_full_disk_never_advises_resume_where_there_is_none(
    ws, model_dir, full_disk, args, target
) -> None:
    outcome = ws.refused([*args, "--model", str(model_dir)], "disk full while writing")
    assert "--resume" not in outcome.err and "rerun the same command" in outcome.err
    assert not (ws.root / target).exists()


def test_a_full_disk_in_tokens_leaves_nothing_and_says_rerun(
    ws, model_dir, corpus, fast_probes, full_disk
) -> None:
    """The run printed its estimate and progress before the disk filled: the refusal is
    its last line, and nothing is left behind."""
    before = ws._state()
    outcome = ws.main(_tokens(model_dir, corpus, "t"))
    *log, last = outcome.err_lines
    assert outcome.code == 2 and "Traceback" not in outcome.err, outcome.err
    assert last.startswith("error: disk full while writing") and "rerun" in last, outcome.err
    assert log[0].startswith("tokens on ") and "about" in log[0], outcome.err
    assert all(re.search(r": \d+/\d+ \(\d+%\) elapsed", line) for line in log[1:]), outcome.err
    assert "--resume" not in outcome.err and ws._state() == before
    assert not (ws.root / "t").exists() and not list(ws.root.glob(".t.identifiable*"))


# ---- a run killed before the end: no temporary file survives ----------------------------------


def test_temporaries_of_a_killed_run_never_reach_the_report(ws, model_dir, monkeypatch) -> None:
    """A run stopped half way (its partial folder kept), temporary files planted where a
    killed writer leaves them, then `--resume` with a seed at the top of the range: the
    finished report and its manifest hold no temporary file, and the summary is printed
    once."""
    import identifiable.experiments.stages as stages
    from helpers.corpora import small_corpus

    corpus = ws.root / "pairs.txt"
    corpus.write_text("\n".join(f"{a} {b}" for a, b in small_corpus(24)) + "\n", "utf-8")
    args = ["reproduce", "--model", str(model_dir), "--corpus", str(corpus), "--budget",
            "smoke", "--out", "r", "--no-progress", "--seed", str(SEED_MAX)]  # fmt: skip

    def stop(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(stages, "attribution_shard_tables", stop)
        stopped = ws.main(args)
    assert stopped.code == 130 and "rerun with --resume" in stopped.err
    partial = ws.root / ".r.identifiable-partial"
    stage_dirs = [p for p in (partial / ".cache").iterdir() if p.is_dir()]
    assert stage_dirs, "no stage had finished a shard before the stop"
    planted = [
        stage_dirs[0] / ".00000.t.parquet.k3j_9xq2.tmp",
        partial / ".index.html.a1b2c3d4.tmp",
        partial / ".cache" / ".settings.json.zz99zz99.tmp",
    ]
    for path in planted:
        path.write_bytes(b"half a file")
    resumed = ws.main([*args, "--resume"])
    assert resumed.code == 0, resumed.err
    report = ws.root / "r"
    assert _no_temporaries(ws.root) == []
    manifest = json.loads((report / ".cache" / "manifest.json").read_text())
    assert not [name for name in manifest["files"] if is_temporary(Path(name).name)]
    assert resumed.out.count("report: ") == 1  # the summary line, once (smoke: a pipeline check)
