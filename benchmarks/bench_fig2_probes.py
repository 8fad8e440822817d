"""Fig. 2 MLP probes: the linear start against the older random start, side by side.

Target (issue 23): on the quick budget's Fig. 2 data (embedded MiniLM, the Wikipedia sample,
8,192 tokens), every MLP fit of the linear-start protocol ends by early stopping within the
quick cap, at a validation loss no worse than the random start's; reported with the CPU time
of each protocol, measured in one process on the same pairs and the same thread (the fits
run on one intra-op thread), alternating the order per layer so load hits both alike.

    python benchmarks/bench_fig2_probes.py [--layers 5 6] [--cap 1500]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch


def main() -> None:
    from identifiable.corpus import resolve_corpus
    from identifiable.experiments.tokens import extract
    from identifiable.models import load_model
    from identifiable.tokens.evaluate import evaluate_pairs
    from identifiable.tokens.probes import ProbeConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--layers", type=int, nargs="+", default=[5, 6], help="hidden-state indices"
    )
    parser.add_argument("--cap", type=int, default=1500, help="Adam steps of the linear start")
    parser.add_argument("--max-tokens", type=int, default=8192)
    args = parser.parse_args()
    model = load_model("minilm")
    texts = resolve_corpus(
        "wikipedia-sample", model.tokenizer, max_tokens=128, shuffle=True, seed=0
    )
    pairs, _ = extract(model, texts, max_tokens=args.max_tokens)
    linear = replace(ProbeConfig(), max_steps=args.cap)
    random = replace(
        ProbeConfig(),
        mlp_init="random",
        lr_grid=(3e-3, 1e-2),
        weight_decay_grid=(0.0, 0.1),
        select_steps=60,
        max_steps=1000,
    )  # fmt: skip  (the protocol before issue 23's third stop: quick's 1,000-step cap)
    protocols = {"linear start": linear, "random start": random}
    print(f"threads {torch.get_num_threads()} (fits: 1); tokens {pairs.n_tokens}")
    print(
        "| layer | MLP | protocol | stopped | steps | late gain | val loss | test rate | CPU s (layer, so far) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    totals = dict.fromkeys(protocols, 0.0)
    for k, layer in enumerate(args.layers):
        names = list(protocols) if k % 2 == 0 else list(protocols)[::-1]
        for name in names:
            t0 = time.process_time()
            ev = evaluate_pairs(
                pairs, probe_kinds=("mlp",), layers=[layer], cross_layer=(), controls=(),
                probe_config=protocols[name],
            )  # fmt: skip
            totals[name] += time.process_time() - t0
            for _, r in ev.per_layer.iterrows():
                print(
                    f"| {layer - 1} | {r.objective} | {name} | {r.stopped} | {r.steps} | "
                    f"{r.late_gain:.3f} | {r.val_loss:.4g} | {r.rate:.3f} | "
                    f"{time.process_time() - t0:.0f} |"
                )
    ratio = totals["linear start"] / totals["random start"]
    print(f"CPU: linear start {totals['linear start']:.0f} s, random start "
          f"{totals['random start']:.0f} s, ratio {ratio:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
