"""`finetune` and the weights it writes, under hostile settings: a weight of 1e308, a loss
that turns NaN half way, a sweep the disk or the time budget cannot hold, a run killed
while it saves, and models whose weights are not finite given to `trace` and `compare`.

Nothing non-finite is ever saved (`nonfinite_files` reads every weight file the runs
leave), and every refusal is one line with exit status 2."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from helpers.cli import SCRIPT
from helpers.corpora import word_paragraphs
from helpers.training import nonfinite_files
from identifiable.store.files import is_temporary

TINY = [
    "--steps",
    "2",
    "--batch-size",
    "2",
    "--max-tokens",
    "40",
    "--min-tokens",
    "18",
    "--no-evaluate",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    return word_paragraphs(path, seed=0, paragraphs=15, sentences=6, words=(8, 14))


def _finetune(model_dir: Path, corpus: Path, *extra: str) -> list[str]:
    return ["finetune", "--model", str(model_dir), "--corpus", str(corpus), *TINY, *extra]


def _temporaries(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if is_temporary(p.name)]


# ---- penalty weights ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("penalty", "expect"),
    [
        ("1e308", "--penalty 1e+308 must be a finite number between 0 and 1000"),  # the issue's
        ("1001", "between 0 and 1000"),
        ("inf", "between 0 and 1000"),
        ("0.1,1e308", "--penalty 1e+308"),
    ],
)
def test_a_weight_outside_the_documented_range_is_refused(ws, model_dir, corpus, penalty, expect):
    ws.refused(_finetune(model_dir, corpus, "--penalty", penalty, "--out", "ft1"), expect)


def test_a_loss_that_turns_nan_stops_the_run_before_anything_is_saved(
    ws, model_dir, corpus, monkeypatch
) -> None:
    """The second step's penalty is NaN (as a weight of 1e308 made it): the run stops there
    in one line, exit 2, with no checkpoint; the resume point of step 1 is finite."""
    import identifiable.training.loop as loop

    real, calls = loop.null_attention_penalty, []

    def turns_nan(*args, **kwargs):
        r = real(*args, **kwargs)
        calls.append(1)
        return replace(r, penalty=r.penalty * float("nan")) if len(calls) == 2 else r

    monkeypatch.setattr(loop, "null_attention_penalty", turns_nan)
    out = ws.main(
        _finetune(model_dir, corpus, "--penalty", "0.5", "--save-every", "1", "--out", "ft")
    )
    assert out.code == 2 and "Traceback" not in out.err, out.err
    errors = [line for line in out.err_lines if line.startswith("error:")]
    assert errors == [errors[0]] and "the loss is nan at step 2" in errors[0], out.err
    assert "--penalty" in errors[0] and "--lr" in errors[0]
    assert not (ws.root / "ft").exists()
    assert not list(ws.root.rglob("model.safetensors")) and not list(ws.root.rglob("done.json"))
    assert list(ws.root.rglob("state.pt")), "the finite resume point of step 1 was kept"
    assert nonfinite_files(ws.root) == [] and _temporaries(ws.root) == []


def test_a_non_finite_gradient_stops_the_step_before_the_update(tiny_model) -> None:
    """A finite loss whose gradient is NaN (sqrt at 0): refused before AdamW moves a weight."""
    from identifiable.errors import IdentifiableError
    from identifiable.training import loop

    model = tiny_model("bert")
    hf = model.hf_model
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-3)
    batch = loop.encode_batch(model, ["the cat sat on the mat", "a dog ran"])
    target = hf(**batch).last_hidden_state.detach()
    real = loop.null_attention_penalty

    def nan_gradient(*args, **kwargs):
        r = real(*args, **kwargs)
        zero = next(hf.parameters()).flatten()[0] * 0
        return replace(r, penalty=r.penalty + zero.abs().sqrt())  # 0, gradient inf · 0 = NaN

    settings = loop.TrainSettings(steps=1, warmup=0)
    loop.null_attention_penalty = nan_gradient
    try:
        with pytest.raises(IdentifiableError, match="the gradient is nan at step 1"):
            loop.train_step(model, opt, batch, target, 0.5, settings, 0)
    finally:
        loop.null_attention_penalty = real
        hf.zero_grad(set_to_none=True)
    assert all(torch.equal(before[k], v) for k, v in hf.state_dict().items())


def test_non_finite_weights_are_never_saved(tmp_path, tiny_model) -> None:
    """The last guard, at every save: a model whose weights turned NaN is not written."""
    from identifiable.errors import IdentifiableError
    from identifiable.training import loop

    model = tiny_model("bert")
    p = next(model.hf_model.parameters())
    saved = p.detach().clone()
    with torch.no_grad():
        p[0, 0] = float("nan")
    try:
        with pytest.raises(IdentifiableError, match="hold NaN or inf"):
            loop.save_checkpoint(model, tmp_path / "ck", None, [])
        opt = torch.optim.AdamW(model.hf_model.parameters())
        with pytest.raises(IdentifiableError, match="hold NaN or inf"):
            loop._save_state(tmp_path / "st", model.hf_model, opt, [], 1)
    finally:
        with torch.no_grad():
            p.copy_(saved)
    assert not list(tmp_path.rglob("*.safetensors")) and not list(tmp_path.rglob("*.pt"))


# ---- models whose weights are not finite ---------------------------------------------------


@pytest.fixture(scope="module")
def nan_model(model_dir, tmp_path_factory) -> Path:
    """The tiny model folder with NaN in its attention weights (a diverged fine-tune)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("nan") / "nan-bert"
    shutil.copytree(model_dir, folder)
    weights = load_file(folder / "model.safetensors")
    for name, t in weights.items():
        if "attention" in name and t.is_floating_point():
            t.fill_(float("nan"))
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_trace_names_non_finite_weights(ws, nan_model) -> None:
    ws.inputs.append(nan_model)
    out = ws.refused(["trace", "the cat sat.", "--model", str(nan_model)], "hold NaN or inf")
    assert "fp16" not in out.err and "float32" not in out.err and "attention" in out.err


def test_compare_names_non_finite_weights_and_leaves_no_partial(ws, model_dir, nan_model) -> None:
    """The issue's case: `compare` ran the first model's reproduction, then advised "fp16
    overflow" and left .cmpnan.identifiable-partial. Now it refuses before writing."""
    ws.inputs.append(nan_model)
    out = ws.refused(
        ["compare", str(model_dir), str(nan_model), "--budget", "smoke", "--out", "cmpnan"],
        "hold NaN or inf",
    )
    assert "fp16" not in out.err
    assert not list(ws.root.glob(".cmpnan*"))


def test_analyses_of_a_non_finite_model_blame_its_weights_not_fp16(nan_model) -> None:
    from identifiable.attention import effective_attention
    from identifiable.errors import IdentifiableError
    from identifiable.models import load_model

    trace = load_model(str(nan_model)).trace("the cat sat on the mat")
    with pytest.raises(IdentifiableError) as info:
        effective_attention(trace)
    assert "fp16" not in str(info.value) and "weights" in str(info.value)


# ---- sweeps: disk and time before the first weight ---------------------------------------


def test_a_sweep_the_disk_cannot_hold_is_refused_before_the_first_weight(
    ws, model_dir, corpus, monkeypatch
) -> None:
    """5,000 weights of the tiny model need about 5,000 checkpoints: refused on a disk with
    1 GB free, naming the sizes, before any training step."""
    import identifiable.runs.finetune as run

    usage = shutil.disk_usage(ws.root)
    monkeypatch.setattr(run.shutil, "disk_usage", lambda p: usage._replace(free=10**9))
    weights = ",".join(f"{i / 10:g}" for i in range(5000))
    out = ws.refused(
        _finetune(model_dir, corpus, "--penalty", weights, "--out", "sweep"),
        "5000 penalty weights × 2 steps need about",
    )
    assert "1.0 GB free" in out.err and "--penalty" in out.err and "--out" in out.err


def test_a_sweep_over_its_time_budget_is_refused_with_the_measured_step(
    ws, model_dir, corpus
) -> None:
    out = ws.refused(
        _finetune(
            model_dir, corpus, "--penalty", "0,0.1,1", "--time-budget", "0.001", "--out", "sweep"
        ),
        "3 penalty weights × 2 steps need about",
    )
    assert "a step here), over --time-budget 0.001" in out.err and "--steps" in out.err


def test_the_estimate_follows_the_weights_and_the_steps(tiny_model, tmp_path) -> None:
    """The time estimate grows with weights × steps (so the check can pass and fail), and
    a resumed run counts only the weights it still has to train."""
    from identifiable.errors import IdentifiableError
    from identifiable.runs.finetune import preflight
    from identifiable.store.outdir import OutputFolder
    from identifiable.training.loop import TrainSettings

    model = tiny_model("bert")
    items = [("the cat sat on the mat", "a dog ran far away")] * 4
    lines: list[str] = []
    s = TrainSettings(steps=3, batch_size=2)
    folder = OutputFolder(tmp_path / "o")
    preflight(model, items, [0.1], s, folder, None, lines.append)
    assert "1 penalty weight × 3 steps" in lines[-1]
    seconds = float(lines[-1].split("(")[1].split(" s a step")[0])
    preflight(model, items, [0.1], s, folder, 100 * 3 * 2 * seconds, lines.append)  # fits
    with pytest.raises(IdentifiableError, match="40 penalty weights × 3 steps"):
        preflight(model, items, [i / 10 for i in range(40)], s, folder, seconds, print)
    # resumed: the weights finished in the work folder need neither time nor disk
    done = folder.partial / "penalty-0.1"
    done.mkdir(parents=True)
    (done / "done.json").write_text(json.dumps({"log": []}))
    resumed = OutputFolder(tmp_path / "o", resume=True)
    preflight(model, items, [0.1, 0.2], s, resumed, None, lines.append)
    assert "1 penalty weight × 3 steps" in lines[-1]


# ---- killed runs ---------------------------------------------------------------------------


def test_a_resumed_finetune_removes_the_temporaries_a_killed_run_left(
    ws, model_dir, corpus, monkeypatch
) -> None:
    """kill -9 during a save leaves `.state.pt.XXXXXXXX.tmp`: the resumed run removes it
    before its first step, and the finished folder holds no temporary."""
    import identifiable.training.loop as loop

    args = _finetune(model_dir, corpus, "--penalty", "0.5", "--save-every", "1", "--out", "ft")
    real = loop.train_step

    def stop_at_2(model, opt, inputs, target, weight, s, step):
        if step == 1:
            raise KeyboardInterrupt
        return real(model, opt, inputs, target, weight, s, step)

    with monkeypatch.context() as m:
        m.setattr(loop, "train_step", stop_at_2)
        first = ws.main(args)
    assert first.code == 130 and "rerun with --resume" in first.err
    (state,) = ws.root.glob(".ft.identifiable-partial/.cache/train-*/state.pt")
    planted = state.parent / ".state.pt.k3j9xq2z.tmp"
    planted.write_bytes(b"half a state")
    seen = []

    def watch(model, opt, inputs, target, weight, s, step):
        seen.append(_temporaries(ws.root))
        return real(model, opt, inputs, target, weight, s, step)

    monkeypatch.setattr(loop, "train_step", watch)
    resumed = ws.main([*args, "--resume"])
    assert resumed.code == 0, resumed.err
    assert seen == [[]], seen  # gone before the first resumed step
    assert _temporaries(ws.root) == [] and nonfinite_files(ws.root) == []
    assert (ws.root / "ft" / "model.safetensors").is_file()


def test_sigterm_during_a_finetune_says_resume_and_leaves_no_temporary(
    ws, model_dir, corpus
) -> None:
    """`kill PID` while resume points are written every step: the file being written is
    removed, one line says how to resume, exit 130."""
    args = [
        *_finetune(model_dir, corpus, "--penalty", "0.5", "--save-every", "1", "--out", "ft"),
        "--steps",
        "400",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [str(SCRIPT), *args], cwd=ws.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 240
    while not list(ws.root.glob(".ft.identifiable-partial/.cache/train-*/state.pt")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    lines = [ln for ln in err.decode().splitlines() if not ln.startswith("finetune")]
    assert proc.returncode == 130 and lines == ["interrupted; rerun with --resume"], err
    assert _temporaries(ws.root) == [] and nonfinite_files(ws.root) == []


# ---- flags, not field names ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        (["--save-every", "0"], "--save-every 0 must be at least 1"),
        (["--batch-size", "0"], "--batch-size 0 must be at least 1"),
        (["--min-tokens", "50"], "--min-tokens 50 exceeds --max-tokens 40"),
        (["--lr", "nan"], "--lr nan must be a finite number"),
        (["--variant", "junk"], "--variant must be one of"),
    ],
)
def test_finetune_refusals_name_the_flags(ws, model_dir, corpus, extra, expect) -> None:
    out = ws.refused([*_finetune(model_dir, corpus, "--out", "ft"), *extra], expect)
    for field in ("save_every", "batch_size", "min_tokens", "max_tokens"):
        assert field not in out.err


def test_too_few_pairs_names_the_flags_to_the_cli_and_the_arguments_to_python(
    ws, model_dir, corpus
) -> None:
    from identifiable.errors import IdentifiableError
    from identifiable.runs.finetune import finetune
    from identifiable.training.loop import TrainSettings

    out = ws.refused(
        [*_finetune(model_dir, corpus, "--out", "ft"), "--batch-size", "5000"],
        "fewer than --batch-size 5000: lower --min-tokens or --batch-size",
    )
    assert "batch_size" not in out.err
    s = TrainSettings(steps=2, batch_size=5000, max_tokens=40, min_tokens=18)
    with pytest.raises(IdentifiableError, match="lower min_tokens= or batch_size=") as info:
        finetune(str(model_dir), 0.1, ws.root / "py", corpus=str(corpus), settings=s)
    assert "--" not in str(info.value)
    with pytest.raises(IdentifiableError, match=r"^save_every=0 must be at least 1$"):
        finetune(str(model_dir), 0.1, ws.root / "py", settings=TrainSettings(save_every=0))
