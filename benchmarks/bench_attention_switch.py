"""The cost of keeping the user's attention implementation: a call that needs eager attention
switches for the call and back (`models.backends.eager`), where the model used to rest on
eager between calls. Side by side, in one process, same threads: a trace and a Hidden Token
Attribution (the 4-probe estimator) of MiniLM (a BERT whose user set sdpa, traced eager
here, so every call switches) against the same calls on a model already eager (no switch),
run alternately, and the switch alone.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_attention_switch.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

TEXT = "The old miller sold his bread to the travellers on the bridge."


def _best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _side_by_side(a: Callable[[], object], b: Callable[[], object], repeats: int):
    """Medians of `a` and `b`, run alternately (a load that changes hits both alike)."""
    ta, tb = [], []
    for _ in range(repeats):
        for fn, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import identifiable as idf
    from identifiable.models import backends

    switching = idf.load_model("minilm", attention="eager")  # loaded eager: then make it sdpa
    switching.hf_model.set_attn_implementation("sdpa")  # the user's own: every call switches
    resting = idf.load_model("minilm", attention="eager")  # eager already: no switch
    assert backends.implementation(switching.hf_model) == "sdpa"
    rows = []
    for name, call in [
        ("trace", lambda m: m.trace(TEXT)),
        ("HTA (4 probes)", lambda m: idf.hidden_token_attribution(m, TEXT, 4, progress=False)),
    ]:
        call(switching), call(resting)  # warm up
        a, b = _side_by_side(
            lambda call=call: call(switching), lambda call=call: call(resting), args.repeats
        )
        rows.append((name, a, b))
    hf = switching.hf_model

    def switch_only() -> None:
        with backends.eager(hf):
            pass

    alone = _best(switch_only, max(args.repeats, 20))
    print(f"threads {torch.get_num_threads()}; medians of {args.repeats}")
    print("| call | switches (user's sdpa kept) | rests eager | ratio |")
    print("| --- | --- | --- | --- |")
    for name, a, b in rows:
        print(f"| {name} | {a * 1e3:.1f} ms | {b * 1e3:.1f} ms | {a / b:.3f} |")
    print(f"| the switch alone (eager and back) | {alone * 1e3:.2f} ms | | |")
    assert backends.implementation(hf) == "sdpa"


if __name__ == "__main__":
    main()
