"""Multi-head latent attention at long context: all-head effective attention against a plain
sdpa forward of the same weights, as a ratio, in one process (issue 54).

Model (random weights, real widths, 2 layers, one sequence of Zipf-distributed token ids):
DeepSeek-V3-style attention at Llama-3-like widths: hidden 4096, 32 heads, latent
kv_lora_rank 512, query low-rank path 1536, query/key width 128 + 64 (RoPE), value width
v_head_dim 128, dense MLP 14336 in both layers. The trace is taken under eager attention;
the forward is the same weights under sdpa. Both sides run at the same torch threads
(`--threads`, default 2), interleaved, median of `--repeats`; the load average is printed
(other jobs on the shared machine slow both sides alike: quote the ratio).

`--before REV` also runs the attention package of git revision REV (read with git, imported
as `_before_attention`) on the same trace in the same process, at the n of `--before-n`
(default all), and reports its time, its ratio and the largest difference between the two
results.

Run: python benchmarks/bench_mla.py [--n 2048] [--threads 2] [--repeats 1] [--json out.json]
     [--before REV] [--before-n 512 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch


def before_attention(rev: str):
    """`effective_attention` of the attention package at git revision `rev`, imported as
    package `_before_attention` from a temporary copy (its own imports rewritten; an
    empty `__init__`, so that only the modules effective attention imports are loaded)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", root, *args], capture_output=True, text=True, check=True
        ).stdout

    names = git("ls-tree", "--name-only", rev, "src/identifiable/attention/").split()
    top = tempfile.mkdtemp(prefix="bench_mla_before_")
    pkg = os.path.join(top, "_before_attention")
    os.mkdir(pkg)
    for path in (x for x in names if x.endswith(".py") and not x.endswith("__init__.py")):
        src = git("show", f"{rev}:{path}")
        src = src.replace("identifiable.attention.", "_before_attention.")
        src = src.replace("from identifiable.attention import", "from _before_attention import")
        with open(os.path.join(pkg, os.path.basename(path)), "w") as f:
            f.write(src)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    sys.path.insert(0, top)
    from _before_attention.effective import effective_attention

    return effective_attention


def zipf_ids(n: int, seed: int = 0) -> list[int]:
    """n ids drawn with p ∝ 1/rank from 8,000 word pieces of the vocabulary."""
    rng = np.random.default_rng(seed)
    vocab = np.arange(1000, 9000)
    p = 1.0 / np.arange(1, vocab.size + 1)
    return vocab[rng.choice(vocab.size, size=n, p=p / p.sum())].tolist()


def build():
    from transformers import AutoConfig, AutoModel

    from identifiable.models import Model

    cfg = AutoConfig.for_model(
        "deepseek_v3",
        hidden_size=4096,
        num_hidden_layers=2,
        num_attention_heads=32,
        num_key_value_heads=32,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        intermediate_size=14336,
        first_k_dense_replace=2,
        max_position_embeddings=8192,
        vocab_size=30522,
        pad_token_id=0,
        bos_token_id=101,
        eos_token_id=102,
    )
    torch.manual_seed(0)
    hf = AutoModel.from_config(cfg, attn_implementation="eager").eval()
    return hf, Model.from_hf(hf, name="deepseek-v3-style-2-layers-random")


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        out = None
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def sdpa_forward(hf, ids: list[int], repeats: int) -> float:
    hf.set_attn_implementation("sdpa")
    x = torch.tensor([ids])
    try:
        with torch.no_grad():
            hf(x[:, :16])
            return timed(lambda: hf(x), repeats)[0]
    finally:
        hf.set_attn_implementation("eager")


def invariant_error(trace, effective: torch.Tensor) -> float:
    """max over heads of ‖(A_eff − A) V H‖ / ‖A V H‖."""
    worst = 0.0
    for layer in range(effective.shape[0]):
        a = trace.attentions[layer].double()
        t = trace.values[layer].double() @ trace.out_proj[layer].double()
        err = ((effective[layer].double() - a) @ t).norm(dim=(-2, -1))
        worst = max(worst, float((err / (a @ t).norm(dim=(-2, -1))).max()))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[2048])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--before", help="git revision of the attention package to compare")
    ap.add_argument("--before-n", type=int, nargs="*", help="n to run it at (default all)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from identifiable.attention import effective_attention

    before = before_attention(args.before) if args.before else None

    hf, model = build()
    rows = []
    for n in args.n:
        ids = zipf_ids(n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t_trace, trace = timed(lambda i=ids: model.trace(i), 1)
        verify = float(trace.verify().max())
        fwd = sdpa_forward(hf, ids, args.repeats)
        t_eff, ea = timed(lambda tr=trace: effective_attention(tr), args.repeats)
        row = {
            "n": n,
            "threads": args.threads,
            "forward_sdpa_s": round(fwd, 3),
            "trace_eager_s": round(t_trace, 3),
            "effective_all_heads_s": round(t_eff, 3),
            "ratio_effective_to_forward": round(t_eff / fwd, 3),
            "verify_max": verify,
            "invariant_max": invariant_error(trace, ea.effective),
            "heads": int(trace.n_heads) * int(trace.n_layers),
            "d_v": int(trace.values.shape[-1]),
            "load": "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg()),
            "torch": torch.__version__,
        }
        if before is not None and (args.before_n is None or n in args.before_n):
            t_old, old = timed(lambda tr=trace: before(tr), args.repeats)
            row["before"] = args.before
            row["before_effective_all_heads_s"] = round(t_old, 3)
            row["before_ratio_effective_to_forward"] = round(t_old / fwd, 3)
            row["before_max_abs_difference"] = float((old.effective - ea.effective).abs().max())
            row["load_after_before"] = "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
            del old
        print(json.dumps(row), flush=True)
        rows.append(row)
        del trace, ea
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
