"""Calibration of the HTA estimator's stated interval on the embedded model (issue 50).

For each text the exact contributions (n·d JVPs) are the truth; for each probe count k and
each of `--draws` seeds per text (distinct seeds: probes depend only on (seed, position), so
one seed shared by all texts reuses the same frames and correlates their errors) the
`interval()` of the k-probe estimate is checked against them. Coverage is pooled over the
live entries of all layers; its standard error is clustered by (text, draw), the unit whose
errors are independent. Also reported: ± 1.96·stderr (normal quantile) beside the stated
t interval.

Run: python benchmarks/bench_hta_coverage.py [--probes 8 16 32] [--draws 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch

TEXTS = [
    "The cat sat on the mat.",
    "Paris is the capital of France.",
    "Rain fell all night long.",
    "She wrote three short letters.",
    "Birds sing at dawn in spring.",
    "The river runs past the mill.",
    "He counted coins by candlelight.",
    "A storm broke over the hills.",
]


def coverage(hits: list[float], sizes: list[float]) -> tuple[float, float]:
    """Pooled ratio and its cluster standard error."""
    h, m = torch.tensor(hits, dtype=torch.float64), torch.tensor(sizes, dtype=torch.float64)
    c = float(h.sum() / m.sum())
    n = len(hits)
    se = math.sqrt(float(((h - c * m) ** 2).sum()) * n / (n - 1)) / float(m.sum())
    return c, se


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--probes", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--draws", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from identifiable.attribution import hidden_token_attribution
    from identifiable.models import load_model

    model = load_model("minilm")
    t0 = time.perf_counter()
    exact = [hidden_token_attribution(model, t, progress=False).contributions for t in TEXTS]
    rows = []
    for k in args.probes:
        stated: tuple[list[float], list[float]] = ([], [])
        normal: list[float] = []
        for t, text in enumerate(TEXTS):
            for draw in range(args.draws):
                est = hidden_token_attribution(
                    model, text, probes=k, seed=1000 * t + draw, progress=False
                )
                assert est.stderr is not None
                lo, hi = est.interval()
                live = est.stderr > 0
                truth = exact[t]
                stated[0].append(float(((lo <= truth) & (truth <= hi))[live].sum()))
                stated[1].append(float(live.sum()))
                near = (est.contributions - truth).abs() <= 1.96 * est.stderr
                normal.append(float(near[live].sum()))
        c, se = coverage(*stated)
        cz, sez = coverage(normal, stated[1])
        rows.append(
            {
                "probes": k,
                "cases": len(TEXTS) * 6,
                "draws": args.draws,
                "entries": int(sum(stated[1])),
                "coverage_t": c,
                "se_t": se,
                "coverage_z": cz,
                "se_z": sez,
            }
        )
        print(
            f"k={k}: t interval {c:.2%} ± {se:.2%}, ±1.96·stderr {cz:.2%} ± {sez:.2%} "
            f"({int(sum(stated[1]))} entries)",
            flush=True,
        )
    info = {
        "texts": len(TEXTS),
        "layers": 6,
        "threads": args.threads,
        "seconds": time.perf_counter() - t0,
        "load": os.getloadavg()[0],
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(info, fh, indent=1)


if __name__ == "__main__":
    main()
