"""Context mixing on MiniLM: cost of each method as a ratio to one forward pass.

Run:  python benchmarks/bench_mixing.py [--n 128] [--threads 1] [--repeats 3]
                                        [--flow-n 128] [--skip-flow]

Everything runs in this one process, on one n-token sequence of the embedded
all-MiniLM-L6-v2, with the same thread count on both sides of every ratio:
- `norm`, `globenc`, `alti` (each a full `context_mixing` call, tracing included) vs one
  plain forward pass of the Hugging Face model (eager attention, no_grad); target ≤ 3×.
  The ratio to `Model.trace` (the capture every trace-based method starts from) is
  printed beside it;
- `flow` for all layers at `--flow-n` tokens vs one forward pass; target ≤ 10×;
- `value-zeroing` batched (one pass at batch n) vs a loop of n single-token re-runs
  (each re-runs every layer once from its captured input, token j's values zeroed);
  target ≥ 5× faster, with equal values (max |Δ| printed). Beside it, the exact algebraic
  shortcut (`value_zeroing_shortcut`): zeroing v_j changes the attention output of token i
  by −Σ_h α^h_ij f_h(x_j), so only the rest of the block (LN1, FFN, LN2: per token) is
  re-run, for the n² (i, j) rows; BERT-family blocks only, here to measure the bound.
Times are medians of `--repeats` runs (flow: one run), in CPU seconds of this process
(the machine is shared; with a fixed thread count CPU time measures the work done).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch

from identifiable.mixing import context_mixing
from identifiable.mixing.api import _Inputs, value_zeroing_distances
from identifiable.mixing.perturb import cosine_distances
from identifiable.models import load_model
from identifiable.models.blocks import rerun_layers_zeroing_values

TEXT = (
    "Anarchism is a political philosophy and movement that is sceptical of authority and "
    "rejects all involuntary, coercive forms of hierarchy. Anarchism calls for the abolition "
    "of the state, which it holds to be unnecessary, undesirable, and harmful. As a "
    "historically left-wing movement, placed on the farthest left of the political spectrum, "
    "it is usually described alongside communalism and libertarian Marxism as the libertarian "
    "wing of the socialist movement, and has a strong historical association with "
    "anti-capitalism and socialism. Humans lived in societies without formal hierarchies long "
    "before the establishment of formal states, realms, or empires. With the rise of organised "
    "hierarchical bodies, scepticism toward authority also rose."
)


def text_of(model, n: int) -> str:
    """A prefix of TEXT that the model encodes to exactly n tokens (specials included)."""
    words = TEXT.split()
    for k in range(len(words), 0, -1):
        candidate = " ".join(words[:k])
        if len(model.encode(candidate)) <= n:
            ids = model.tokenizer(candidate, add_special_tokens=False)["input_ids"]
            body = ids[: n - 2]
            return model.tokenizer.decode(body)
    raise SystemExit(f"cannot build a {n}-token text")


def cpu_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def value_zeroing_shortcut(model, tr) -> torch.Tensor:
    """`[L, n, n]` value-zeroing distances of a BERT-family (post-LN) model without re-running
    attention: h_i with v_j zeroed = LN2(FFN(y) + y), y = LN1(x_i + a_i − Σ_h α^h_ij f_h(x_j)),
    where a_i is the captured attention output. Exact up to float rounding."""
    from identifiable.mixing.decompose import mixed_vectors, transformed_values

    n = tr.n_tokens
    out = torch.empty(tr.n_layers, n, n, dtype=torch.float64)
    with torch.no_grad():
        for layer, block in enumerate(model.layers):
            f = transformed_values(tr.values[layer], tr.value_bias[layer], tr.out_proj[layer])
            delta = mixed_vectors(tr.attentions[layer], f)  # [i, j, d]
            base = tr.hidden_states[layer] + tr.attn_outputs[layer]  # x_i + a_i
            y = block.attention.output.LayerNorm(base[:, None, :] - delta)  # [i, j, d]
            h = block.output(block.intermediate(y), y)
            out[layer] = cosine_distances(tr.hidden_states[layer + 1][:, None], h[None])[0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--flow-n", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-flow", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    model = load_model("minilm")
    text = text_of(model, args.n)
    enc = model.encode(text)
    n = len(enc)
    inputs = model.batch_inputs([enc])
    print(f"all-MiniLM-L6-v2, n = {n} tokens, {torch.get_num_threads()} thread(s), CPU seconds")

    def forward() -> None:
        with torch.no_grad():
            model.hf_model(**inputs)

    forward()  # warm-up
    t_fwd = cpu_seconds(forward, max(5, args.repeats))
    t_trace = cpu_seconds(lambda: model.trace(text), args.repeats)
    print(f"  forward pass            {t_fwd * 1e3:8.1f} ms")
    print(f"  Model.trace             {t_trace * 1e3:8.1f} ms   {t_trace / t_fwd:5.2f}× forward")
    for method in ("norm", "globenc", "alti"):
        t = cpu_seconds(lambda m=method: context_mixing(model, text, m), args.repeats)
        verdict = "meets" if t / t_fwd <= 3 else "misses"
        print(
            f"  {method:<8}                {t * 1e3:8.1f} ms   {t / t_fwd:5.2f}× forward "
            f"({t / t_trace:4.2f}× trace) — {verdict} the ≤ 3× target"
        )

    # Value zeroing: batched (one pass at batch n) vs a loop of n single-token re-runs.
    x = _Inputs(model, text, True, False)
    tr = x.trace
    start = time.process_time()
    batched = value_zeroing_distances(x, chunk=n)
    t_batched = time.process_time() - start
    start = time.process_time()
    looped = torch.zeros_like(batched)
    for j in range(n):
        out = rerun_layers_zeroing_values(
            model, tr.hidden_states[:-1], enc.input_ids, torch.tensor([j]), enc.token_type_ids
        )
        looped[:, :, j] = cosine_distances(tr.hidden_states[1:], out)[0]
    t_loop = time.process_time() - start
    diff = float((batched - looped).abs().max())
    verdict = "meets" if t_loop / t_batched >= 5 else "misses"
    print(
        f"  value-zeroing batched   {t_batched * 1e3:8.1f} ms; loop of {n} re-runs "
        f"{t_loop * 1e3:8.1f} ms: {t_loop / t_batched:5.2f}× faster — {verdict} the ≥ 5× "
        f"target; max |Δ| = {diff:.1e}"
    )

    start = time.process_time()
    short = value_zeroing_shortcut(model, tr)
    t_short = time.process_time() - start
    diff_s = float((short - batched).abs().max())
    print(
        f"  value-zeroing shortcut  {t_short * 1e3:8.1f} ms (no attention re-run): "
        f"{t_loop / t_short:5.2f}× faster than the loop, {t_batched / t_short:5.2f}× faster than "
        f"batched; max |Δ| vs batched = {diff_s:.1e}"
    )

    if not args.skip_flow:
        flow_text = text_of(model, args.flow_n)
        from identifiable.mixing.flow import estimate_seconds

        predicted = estimate_seconds(len(model.encode(flow_text)), model.info.n_layers)
        start = time.process_time()
        context_mixing(model, flow_text, "flow", budget_s=max(60.0, 10 * predicted))
        t_flow = time.process_time() - start
        verdict = "meets" if t_flow / t_fwd <= 10 else "misses"
        print(
            f"  flow, all layers, n = {args.flow_n}: {t_flow:8.1f} s (predicted {predicted:.0f} s)"
            f"   {t_flow / t_fwd:7.0f}× forward — {verdict} the ≤ 10× target"
        )


if __name__ == "__main__":
    main()
