"""Decoders at length, the remaining analyses (issue 46 item 4): `constrained_attention` of
one whole causal head and Hidden Token Attribution at Llama-3 widths, n = 512, each with
`time_budget=`: the wall time to the answer (a result, or the one-line refusal with its
estimate) against the budget.

Model: the 2-layer Llama-3-width random model of `bench_causal.py` (hidden 4096, 32 query
and 8 KV heads of width 128, d_ff 14336), one sequence of Zipf-distributed ids. Threads:
`--threads` (default 2). The load average is printed (other jobs slow every figure).

Run: python benchmarks/bench_decoder_budgets.py [--n 512] [--budgets 30 120] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch


def _bench_causal():
    path = Path(__file__).with_name("bench_causal.py")
    spec = importlib.util.spec_from_file_location("bench_causal", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_causal"] = module
    spec.loader.exec_module(module)
    return module


def answer(fn) -> dict:
    """Wall seconds to the answer and the answer: "returned" or the refusal's text."""
    from identifiable.errors import IdentifiableError

    t = time.perf_counter()
    try:
        fn()
        outcome = "returned"
    except IdentifiableError as exc:
        outcome = str(exc)
    return {"seconds": time.perf_counter() - t, "outcome": outcome, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--budgets", type=float, nargs="+", default=[30.0, 120.0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from identifiable.attention import constrained_attention
    from identifiable.attribution import hidden_token_attribution

    bc = _bench_causal()
    _, model = bc.build("llama")
    ids = bc.zipf_ids(args.n)
    trace = model.trace(ids, layers=[0])
    rows = []
    for budget in args.budgets:
        for name, fn in [
            (
                "constrained_attention(layer 0, head 0)",
                lambda b=budget: constrained_attention(trace, 0, 0, time_budget=b),
            ),
            (
                "hidden_token_attribution(probes=8)",
                lambda b=budget: hidden_token_attribution(model, ids, 8, time_budget=b),
            ),
        ]:
            row = {"what": name, "n": args.n, "budget": budget, **answer(fn)}
            print(
                f"{name}, budget {budget:g} s: {row['seconds']:.1f} s "
                f"(load {row['load']:.1f}): {row['outcome']}",
                flush=True,
            )
            rows.append(row)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"threads": args.threads, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
