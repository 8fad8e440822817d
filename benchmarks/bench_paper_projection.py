"""What `--budget paper` costs: measured FLOP rates on this CPU, projected to BERT-base and a GPU.

Run:  python benchmarks/bench_paper_projection.py [--n 120] [--threads 1] [--gpu-tflops 67]
                                                  [--gpu-efficiency 0.5]

Measured here, in one process with the same torch threads for every line, on the embedded
all-MiniLM-L6-v2 (L = 6, d = 384, d_ff = 1536) and a random BERT-base-sized model (L = 12,
d = 768, d_ff = 3072), one n-token sequence each (CPU seconds of this process):
- one forward pass (eager attention, no_grad);
- `Model.trace` plus `effective_attention` (what Fig. 1 does per sequence);
- Hidden Token Attribution with 2 random probes per token (2n JVPs): the JVP rate.

FLOP count it rests on (multiply-add = 2 FLOPs), per forward pass of n tokens:
    F(n) = L · (2n · (4d² + 2 d·d_ff) + 4n²d)
(Q, K, V and W_O projections, the feed-forward, then QKᵀ and A·V). One JVP tangent pushes a
tangent through the same products, ≈ F(n) FLOPs. Exact HTA needs n·d tangents per sequence,
the k-probe estimator n·k.

The projection multiplies the paper budget's sample counts (`BUDGETS["paper"]`) by these
costs. The CPU projection uses the FLOP rate measured here on the model itself; the GPU
projection assumes a sustained rate of `--gpu-tflops` × `--gpu-efficiency` in float32
(default: 67 TFLOP/s, an H200's float32 peak without tensor cores, at 50%), since no GPU was
measured. Stages that are not FLOP-bound (probe fitting, LPs of certified attention) are not
projected; their measured MiniLM times are in README.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

from identifiable.attention import effective_attention
from identifiable.attribution import hidden_token_attribution
from identifiable.experiments.stages import BUDGETS
from identifiable.models import Model, load_model

TEXT = (
    "Anarchism is a political philosophy and movement that is sceptical of authority and "
    "rejects all involuntary, coercive forms of hierarchy. Anarchism calls for the abolition "
    "of the state, which it holds to be unnecessary, undesirable, and harmful. "
) * 4


def forward_flops(n: int, layers: int, d: int, d_ff: int) -> float:
    return layers * (2 * n * (4 * d * d + 2 * d * d_ff) + 4 * n * n * d)


def cpu_seconds(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def measure(model: Model, n: int) -> dict[str, float]:
    ids = model.encode(TEXT).input_ids[:n]
    assert len(ids) == n, len(ids)
    info, cfg = model.info, model.hf_model.config
    flops = forward_flops(n, info.n_layers, info.hidden_size, int(cfg.intermediate_size))
    inputs = {"input_ids": ids[None], "attention_mask": torch.ones(1, n, dtype=torch.long)}

    def forward() -> None:
        with torch.no_grad():
            model.hf_model(**inputs)

    forward()
    t_fwd = cpu_seconds(forward, 5)
    t_fig1 = cpu_seconds(lambda: effective_attention(model.trace(ids)))
    k = 2
    t_hta = cpu_seconds(
        lambda: hidden_token_attribution(model, ids, probes=k, progress=False), repeats=1
    )
    return {
        "flops": flops,
        "forward_s": t_fwd,
        "fig1_s": t_fig1,
        "jvp_per_s": k * n / t_hta,
        "jvp_gflops": k * n * flops / t_hta / 1e9,
        "d": info.hidden_size,
    }


def hours(seconds: float) -> str:
    return f"{seconds / 3600:8.2f} h" if seconds >= 360 else f"{seconds:8.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=120)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gpu-tflops", type=float, default=67.0)
    parser.add_argument("--gpu-efficiency", type=float, default=0.5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    from transformers import BertConfig, BertModel

    minilm = load_model("minilm")
    torch.manual_seed(0)
    base = Model.from_hf(
        BertModel(BertConfig(attn_implementation="eager")).eval(),
        minilm.tokenizer,
        name="bert-base",
    )
    n, paper = args.n, BUDGETS["paper"]
    gpu = args.gpu_tflops * args.gpu_efficiency * 1e12
    print(f"n = {n} tokens, {torch.get_num_threads()} torch thread(s), CPU seconds")
    for name, model in (("all-MiniLM-L6-v2", minilm), ("BERT-base (random)", base)):
        m = measure(model, n)
        f = m["flops"]
        print(f"\n{name}: forward F(n) = {f / 1e9:.2f} GFLOP, measured {m['forward_s'] * 1e3:.0f} ms "
              f"({f / m['forward_s'] / 1e9:.0f} GFLOP/s); trace + effective attention "
              f"{m['fig1_s'] * 1e3:.0f} ms; JVPs {m['jvp_per_s']:.1f}/s "
              f"({m['jvp_gflops']:.0f} GFLOP/s)")  # fmt: skip
        rate = m["jvp_gflops"] * 1e9
        k = paper.attribution_probes or m["d"]
        rows = [
            (f"Fig. 1: {paper.attention_sequences} sequences",
             paper.attention_sequences * m["fig1_s"], paper.attention_sequences * 2 * f),
            (f"Figs. 3-4: {paper.attribution_sequences} pairs, {k}-probe HTA",
             paper.attribution_sequences * n * k * f / rate, paper.attribution_sequences * n * k * f),
            (f"Figs. 3-4 exact (n·d = {n * m['d']} JVPs per pair)",
             paper.attribution_sequences * n * m["d"] * f / rate,
             paper.attribution_sequences * n * m["d"] * f),
            (f"mixing: HTA of {paper.mixing_sequences} sequences, {paper.mixing_probes} probes",
             paper.mixing_sequences * n * (paper.mixing_probes or m["d"]) * f / rate,
             paper.mixing_sequences * n * (paper.mixing_probes or m["d"]) * f),
        ]  # fmt: skip
        print(f"  {'paper budget stage':<52} {'FLOPs':>10} {'this CPU':>11} {'one GPU':>11}")
        for label, cpu_s, flops in rows:
            print(f"  {label:<52} {flops:10.2e} {hours(cpu_s):>11} {hours(flops / gpu):>11}")
    print(f"\nGPU column: {args.gpu_tflops:g} TFLOP/s × {args.gpu_efficiency:g} assumed "
          "(float32; not measured); Fig. 1 on the GPU counts 2 forward passes per sequence.")  # fmt: skip


if __name__ == "__main__":
    main()
