"""Cost of null-space-aware training, and of fingerprints that see every weight.

1. Step: one fine-tuning step (forward, self-distillation loss, backward, AdamW) with the
   null-attention penalty on every head of every layer, against the same step without it,
   on the same batch (all-MiniLM-L6-v2, Wikipedia pairs of ≤ 72 tokens), same threads,
   at every (batch, threads) point, interleaved, the fastest of `--repeats` each.
   Target (issue 46): ≤ 1.3× at batch 2, 8 and 32 with 1 and 2 threads. `--before COMMIT`
   times the same grid at COMMIT too, in fresh processes alternating with this tree's.
2. Fingerprint: `Model.fingerprint` (XXH3-128 of every tensor) on MiniLM and on a
   BERT-base-sized random model, beside SHA-256 over the same bytes and one forward pass.

    python benchmarks/bench_training.py [--batch 2 8 32] [--threads 1 2] [--repeats 5]
        [--before COMMIT] [--fingerprint] [--json PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def fastest(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _setup(batches: list[int]):
    """MiniLM, one batch of pairs per size (the first `b` pairs of one list), their targets."""
    from identifiable.corpus import load_documents, make_pairs
    from identifiable.models import load_model
    from identifiable.training.loop import encode_batch

    m = load_model("minilm")
    docs = load_documents()
    pairs = make_pairs(docs[:40], m.tokenizer, max_tokens=72, min_tokens=40)
    if len(pairs) < max(batches):
        raise SystemExit(f"only {len(pairs)} pairs for a batch of {max(batches)}")
    data = {}
    for b in batches:
        batch = encode_batch(m, pairs[:b])
        with torch.no_grad():
            target = m.hf_model(**batch).last_hidden_state + 0.01
        data[b] = (batch, target)
    return m, data


def _steps(m, batch, target, opt):
    from identifiable.training import null_attention_penalty
    from identifiable.training.loop import fidelity_loss

    def plain() -> None:
        out = m.hf_model(**batch)
        loss = sum(fidelity_loss(out.last_hidden_state, target, batch["attention_mask"]))
        opt.zero_grad()
        loss.backward()
        opt.step()

    def penalised() -> None:
        r = null_attention_penalty(m, batch, return_outputs=True)
        h = r.outputs.last_hidden_state
        loss = sum(fidelity_loss(h, target, batch["attention_mask"])) + 0.1 * r.penalty
        opt.zero_grad()
        loss.backward()
        opt.step()

    return plain, penalised


def step_grid(batches: list[int], threads: list[int], repeats: int) -> list[dict[str, Any]]:
    """Plain and penalised step at every (batch, threads) point, interleaved: each repeat
    runs every point's plain then penalised step, so load changes hit all cells alike."""
    m, data = _setup(batches)
    opt = torch.optim.AdamW(m.hf_model.parameters(), lr=1e-12, eps=1e-6)
    points = [(b, t) for t in threads for b in batches]
    fns = {p: _steps(m, *data[p[0]], opt) for p in points}
    best = {p: [float("inf"), float("inf")] for p in points}
    for p in points:  # warm-up
        torch.set_num_threads(p[1])
        fns[p][0](), fns[p][1]()
    for _ in range(repeats):
        for p in points:
            torch.set_num_threads(p[1])
            for i in (0, 1):
                best[p][i] = min(best[p][i], fastest(fns[p][i], 1))
    return [
        {
            "batch": b,
            "threads": t,
            "tokens": int(data[b][0]["attention_mask"].sum()),
            "padded": list(data[b][0]["input_ids"].shape),
            "plain_s": best[(b, t)][0],
            "penalty_s": best[(b, t)][1],
            "ratio": best[(b, t)][1] / best[(b, t)][0],
        }
        for b, t in points
    ]


def _tree(commit: str) -> str:
    """A temporary copy of `src/` at `commit` (git archive), for the before side."""
    root = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True
    ).stdout.strip()
    out = tempfile.mkdtemp(prefix="bench-training-")
    archive = subprocess.run(
        ["git", "-C", root, "archive", commit, "src"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    return str(Path(out) / "src")


def before_after(commit: str, args: argparse.Namespace) -> dict[str, Any]:
    """The grid at `commit` and in this tree, in alternating fresh processes (one repeat
    of every point each), the fastest over rounds per side."""
    here = str(Path(__file__).resolve().parents[1] / "src")
    sides = {"before": _tree(commit), "after": here}
    rounds: dict[str, list[list[dict[str, Any]]]] = {"before": [], "after": []}
    for r in range(args.repeats):
        for name, src in sides.items() if r % 2 == 0 else reversed(list(sides.items())):
            cmd = [sys.executable, __file__, "--worker", "--repeats", "1", "--batch"]
            cmd += [str(b) for b in args.batch] + ["--threads"]
            cmd += [str(t) for t in args.threads]
            env = {**os.environ, "PYTHONPATH": src}
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            rounds[name].append(json.loads(out.stdout))
            print(f"round {r + 1} {name}: done", file=sys.stderr)
    result: dict[str, Any] = {"before_commit": commit, "rows": []}
    for i, cell in enumerate(rounds["after"][0]):
        row = {"batch": cell["batch"], "threads": cell["threads"], "padded": cell["padded"]}
        for name in sides:
            plain = min(rd[i]["plain_s"] for rd in rounds[name])
            pen = min(rd[i]["penalty_s"] for rd in rounds[name])
            row[name] = {"plain_s": plain, "penalty_s": pen, "ratio": pen / plain}
        result["rows"].append(row)
    return result


def fingerprint_cost(repeats: int) -> dict[str, dict[str, float]]:
    from transformers import AutoConfig, AutoModel

    from identifiable.models import Model, load_model
    from identifiable.models.fingerprint import model_fingerprint

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "bert",
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
    )
    models = {
        "minilm": load_model("minilm").hf_model,
        "bert-base-sized": AutoModel.from_config(cfg, attn_implementation="eager").eval(),
    }
    out = {}
    for name, hf in models.items():
        n_bytes = sum(t.numel() * t.element_size() for t in hf.state_dict().values())

        def sha(hf=hf) -> None:
            h = hashlib.sha256()
            for t in hf.state_dict().values():
                h.update(memoryview(t.detach().contiguous().view(torch.uint8).numpy()))

        ids = torch.randint(1000, 2000, (1, 128))
        with torch.no_grad():
            fwd = fastest(lambda hf=hf, ids=ids: hf(input_ids=ids), repeats)
        fp = fastest(lambda hf=hf: model_fingerprint(hf), repeats)
        out[name] = {
            "mbytes": n_bytes / 2**20,
            "fingerprint_s": fp,
            "sha256_s": fastest(sha, repeats),
            "forward_n128_s": fwd,
            "fingerprint_per_forward": fp / fwd,
        }
        assert Model.from_hf(hf).fingerprint == model_fingerprint(hf)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, nargs="+", default=[2, 8, 32])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--before", metavar="COMMIT", help="also time the step at COMMIT")
    ap.add_argument("--fingerprint", action="store_true", help="also time fingerprints")
    ap.add_argument("--json", type=Path, help="write the result here too")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(step_grid(args.batch, args.threads, args.repeats)))
        return
    result: dict[str, Any] = {"load_before": os.getloadavg()}
    if args.before:
        result["step"] = before_after(args.before, args)
    else:
        result["step"] = step_grid(args.batch, args.threads, args.repeats)
    if args.fingerprint:
        torch.set_num_threads(max(args.threads))
        result["fingerprint"] = fingerprint_cost(args.repeats)
    result["load_after"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
