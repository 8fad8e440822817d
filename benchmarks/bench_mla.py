"""Multi-head latent attention at long context: all-head effective attention against a plain
sdpa forward of the same weights, as a ratio, in one process (issue 54).

Model (random weights, real widths, 2 layers, one sequence of Zipf-distributed token ids):
DeepSeek-V3-style attention at Llama-3-like widths: hidden 4096, 32 heads, latent
kv_lora_rank 512, query low-rank path 1536, query/key width 128 + 64 (RoPE), value width
v_head_dim 128, dense MLP 14336 in both layers. The trace is taken under eager attention;
the forward is the same weights under sdpa. Both sides run at the same torch threads
(`--threads`, default 2), interleaved, median of `--repeats`; the load average is printed
(other jobs on the shared machine slow both sides alike: quote the ratio).

Run: python benchmarks/bench_mla.py [--n 2048] [--threads 2] [--repeats 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings

import numpy as np
import torch


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
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from identifiable.attention import effective_attention

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
        print(json.dumps(row), flush=True)
        rows.append(row)
        del trace, ea
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
