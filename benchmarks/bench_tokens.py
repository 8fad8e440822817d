"""Token identifiability: whole pipeline vs the extraction forward passes alone.

Target (issue 4): on the embedded model and the default corpus with the default
token budget, extraction + six probe kinds per layer + evaluation (control and
cross-layer matrix included) cost at most 2× the forward passes of the extraction.

Both are measured side by side in one process on the same texts, after one
warm-up forward pass; the order alternates over `--repeats` rounds and the
median of each is reported, so that load from other processes hits both alike.

    python benchmarks/bench_tokens.py [--max-tokens N] [--repeats R]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    from identifiable.corpus import resolve_corpus
    from identifiable.experiments.tokens import (
        DEFAULT_CORPUS,
        DEFAULT_MAX_TOKENS,
        token_identifiability,
    )
    from identifiable.models import load_model
    from identifiable.tokens.extract import collect_token_pairs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--corpus", default=DEFAULT_CORPUS)
    args = parser.parse_args()

    model = load_model("minilm")
    corpus = resolve_corpus(args.corpus, model.tokenizer, max_tokens=128, shuffle=True, seed=0)
    list(model.trace_many(list(corpus)[:8]))  # warm-up: thread pools, allocator

    def extraction() -> tuple[float, int]:
        t = time.perf_counter()
        pairs = collect_token_pairs(model.trace_many(iter(corpus)), max_tokens=args.max_tokens)
        return time.perf_counter() - t, pairs.n_tokens

    def pipeline() -> tuple[float, dict[str, float]]:
        t = time.perf_counter()
        result = token_identifiability(model, corpus, max_tokens=args.max_tokens, progress=False)
        return time.perf_counter() - t, result.timings

    extract_s, total_s, inner = [], [], []
    n_tokens = 0
    for r in range(args.repeats):
        for which in ("extract", "pipeline") if r % 2 == 0 else ("pipeline", "extract"):
            if which == "extract":
                seconds, n_tokens = extraction()
                extract_s.append(seconds)
            else:
                seconds, timings = pipeline()
                total_s.append(seconds)
                inner.append(timings["probes_and_evaluation_s"])
    e, p, q = (statistics.median(v) for v in (extract_s, total_s, inner))
    print(
        f"model minilm, corpus {args.corpus}, {n_tokens} tokens, {torch.get_num_threads()} threads"
    )
    print(
        f"extraction alone (forward passes)   {e:7.2f} s   runs: {[round(x, 2) for x in extract_s]}"
    )
    print(
        f"whole pipeline                      {p:7.2f} s   runs: {[round(x, 2) for x in total_s]}"
    )
    print(f"  of which probes + evaluation      {q:7.2f} s")
    print(f"ratio pipeline / extraction         {p / e:7.2f}x   (target <= 2x)")


if __name__ == "__main__":
    main()
