"""Hidden Token Attribution: exact forward mode vs the reverse-mode reference vs the estimator.

Run:  python benchmarks/bench_attribution.py [--n 32] [--probes 32] [--threads 1]
                                             [--ref-rows 2 | --full-reference]

All three run in this one process on the same input (the embedded all-MiniLM-L6-v2,
one n-token Wikipedia-style sequence) with the same thread count:
- exact mode: n·d JVPs, every layer from one pass (`jacobian_sq_norms`, probes=None);
- the reverse-mode reference: one `autograd.grad` per output coordinate per layer
  (L·n·d backward passes). Its cost is linear in the number of rows (l, i) computed,
  each row being d backward passes; by default it runs `--ref-rows` rows per layer
  and projects the full time from the measured time per row of each layer (printed
  as such). `--full-reference` runs all L·n rows (about 25 min at n = 32 on one core);
- the estimator with k probes per token.
Prints the agreement (max |Δc| on the reference rows), the speed ratios, the estimator's
accuracy, and the exact-mode cost model projected to BERT-base dimensions at n = 128.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

from identifiable.attribution import contributions, jacobian_sq_norms, reverse_mode_sq_norms
from identifiable.attribution.api import model_dims
from identifiable.attribution.memory import ModelDims, bytes_per_tangent, plan_chunk_size
from identifiable.models import load_model

TEXT = (
    "Anarchism is a political philosophy and movement that is sceptical of authority and "
    "rejects all involuntary, coercive forms of hierarchy. Anarchism calls for the abolition "
    "of the state, which it holds to be unnecessary, undesirable, and harmful."
)
BERT_BASE = ModelDims(n_layers=12, n_heads=12, hidden_size=768, intermediate_size=3072)


class Clock:
    """Process CPU time and wall time since creation. CPU time is the figure the ratios use:
    the benchmark machine is shared, and with a fixed thread count CPU seconds measure the
    work done, while wall time also counts waiting for other processes."""

    def __init__(self) -> None:
        self.cpu, self.wall = time.process_time(), time.perf_counter()

    def read(self) -> tuple[float, float]:
        return time.process_time() - self.cpu, time.perf_counter() - self.wall


def flops_per_jvp(n: int, dims: ModelDims) -> float:
    """Multiply-adds ×2 of one JVP: the tangent's linear maps (as a forward pass) plus the
    attention products, which the product rule doubles (dQ·Kᵀ + Q·dKᵀ, dA·V + A·dV)."""
    d, ff = dims.hidden_size, dims.intermediate_size
    per_layer = 2 * n * (4 * d * d + 2 * d * ff) + 2 * 4 * n * n * d
    return float(dims.n_layers * per_layer)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=32, help="sequence length in tokens")
    ap.add_argument("--probes", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for every method")
    ap.add_argument("--ref-rows", type=int, default=2, help="reference rows (l, i) per layer")
    ap.add_argument("--full-reference", action="store_true", help="run every reference row")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)

    model = load_model("minilm")
    enc = model.encode(TEXT)
    if len(enc) < args.n:
        raise SystemExit(f"the benchmark text has only {len(enc)} tokens; use --n ≤ {len(enc)}")
    ids = torch.cat([enc.input_ids[: args.n - 1], enc.input_ids[-1:]])  # keep the final [SEP]
    e0 = model.embed(ids)
    n, d = e0.shape
    n_layers = model.info.n_layers

    def f(x: torch.Tensor) -> torch.Tensor:
        return model.layer_outputs(x, ids)

    print(
        f"model: {model.info.name} (L={n_layers}, d={d}, H={model.info.n_heads}), n={n}, "
        f"threads={args.threads}"
    )

    f(e0)  # warm-up
    clock = Clock()
    exact = jacobian_sq_norms(f, e0)
    t_exact, w_exact = clock.read()
    c_exact = contributions(exact.sq)
    print(
        f"exact (forward mode): {exact.n_jvps} JVPs in chunks of {exact.chunk_size}, "
        f"{t_exact:.1f} s CPU ({w_exact:.1f} s wall)"
    )

    gen = torch.Generator().manual_seed(args.seed)
    per_layer = n if args.full_reference else args.ref_rows
    rows = [
        (layer, int(i))
        for layer in range(1, n_layers + 1)
        for i in torch.randperm(n, generator=gen)[:per_layer].sort().values
    ]
    t_ref = w_ref = 0.0
    ref = torch.full_like(exact.sq, float("nan"))
    for layer in range(1, n_layers + 1):
        mine = [r for r in rows if r[0] == layer]
        clock = Clock()
        got = reverse_mode_sq_norms(f, e0, rows=mine)
        cpu, wall = clock.read()
        t_ref += cpu / len(mine) * n  # time per row of this layer × rows in the layer
        w_ref += wall / len(mine) * n
        for _, i in mine:
            ref[layer - 1, i] = got[layer - 1, i]
    done = ~ref.isnan().any(-1)
    c_ref = contributions(torch.where(ref.isnan(), 0.0, ref))
    dc = (c_exact - c_ref).abs()[done].max().item()
    dsq = ((exact.sq - ref).abs() / ref.abs().clamp_min(1e-30))[done].max().item()
    label = (
        "measured"
        if args.full_reference
        else f"projected from {len(rows)} rows ({len(rows) * d} backward passes)"
    )
    print(
        f"reverse-mode reference: {n_layers * n * d} backward passes, {t_ref:.1f} s CPU "
        f"({w_ref:.1f} s wall; {label})"
    )
    print(
        f"  agreement on {int(done.sum())} rows: max |Δc| = {dc:.2e}, max relative Δ‖J‖² = {dsq:.2e}"
    )
    print(
        f"  => exact mode is {t_ref / t_exact:.1f}x faster than the reference (CPU time; "
        f"{w_ref / w_exact:.1f}x in wall time)"
    )

    clock = Clock()
    est = jacobian_sq_norms(f, e0, probes=args.probes, seed=args.seed)
    t_est, w_est = clock.read()
    c_est = contributions(est.sq)
    rel = ((c_est - c_exact).abs() / c_exact).median().item()
    same_top = (c_est.argmax(-1) == c_exact.argmax(-1)).double().mean().item()
    print(
        f"estimator, k={args.probes}: {est.n_jvps} JVPs, {t_est:.1f} s CPU ({w_est:.1f} s wall) "
        f"=> {t_exact / t_est:.1f}x faster "
        f"than exact; median relative error of c = {100 * rel:.2f}%, same top contributor for "
        f"{100 * same_top:.1f}% of tokens"
    )

    dims = model_dims(model)
    s_per_jvp = t_exact / exact.n_jvps  # CPU seconds
    rate = flops_per_jvp(n, dims) / s_per_jvp
    big_n = 128
    big_jvps = big_n * BERT_BASE.hidden_size
    big_s = big_jvps * flops_per_jvp(big_n, BERT_BASE) / rate
    chunk = plan_chunk_size(big_n, BERT_BASE, 4, big_jvps, 2 * 1024**3)
    print("cost model (exact mode):")
    print(
        f"  JVPs per sequence = n·d = {exact.n_jvps}; {1000 * s_per_jvp:.2f} ms CPU per JVP "
        f"({flops_per_jvp(n, dims) / 1e9:.2f} GFLOP each, {rate / 1e9:.1f} GFLOP/s achieved)"
    )
    print(
        f"  BERT-base (L=12, d=768) at n=128: {big_jvps} JVPs x {flops_per_jvp(big_n, BERT_BASE) / 1e9:.2f} "
        f"GFLOP at the same rate = {big_s / 60:.0f} min per sequence ({args.threads} thread(s)); "
        f"k={args.probes} probes: {big_s * args.probes / BERT_BASE.hidden_size / 60:.1f} min; "
        f"2 GiB budget -> chunks of {chunk} JVPs "
        f"({bytes_per_tangent(big_n, BERT_BASE, 4) / 2**20:.1f} MiB each)"
    )


if __name__ == "__main__":
    main()
