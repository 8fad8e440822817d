"""Decoders at long context: causal and windowed effective attention, and causal
certificates, before and after issue 22, side by side in one process.

Models (random weights, real widths, 2 layers, eager attention, one sequence of
Zipf-distributed token ids, so that tokens repeat as in text):
- Llama-3-style: hidden 4096, 32 query heads, 8 KV heads, head width 128, RoPE
  (θ = 500000), d_ff 14336;
- Gemma-2-style: hidden 2304, 8 query heads, 4 KV heads, head width 256, d_ff 9216,
  soft-capping 50, layer 1 sliding with a window of 512 (the real model's 4096 exceeds
  every n here, which would make it a plain causal layer), layer 2 global.
"before" is the attention package as of commit e0200b5, read with git and run in this
process (module `_old22`); "after" is the working tree. Both run at the same torch
threads (`--threads`, default 1: the machine is shared and oversubscribed threads wait
on each other), interleaved, median of `--repeats`.

Sections:
- effective: per n, one sdpa forward of the same weights (`forward`), all-head effective
  attention (float64, the default, and float32) and each layer alone; ratios to the
  forward; the worst relative invariant error ‖A_eff T − A T‖ / ‖A T‖ over heads, and
  the largest difference between before and after.
- encoder: no regression on encoders, before and after in the same process: BERT-base-sized
  effective attention at n = 512 (float64 and float32, ratio to a forward) and a whole
  MiniLM head's interval map;
- certify: one causal row of 512 keys (`attention_intervals`; before: HiGHS per key, with
  `--before-certify`), and `interval_map(time_budget=30)` on one head and on a whole layer
  (the wall time to the answer, and the answer: a map or the one-line refusal with its
  estimate of the time the map needs).
The load average is printed with each section (other jobs slow both sides alike).

Run: python benchmarks/bench_causal.py [--n 512 1024 2048] [--before-n 512 1024]
     [--sections effective windows certify] [--threads 1] [--repeats 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types
import warnings

import numpy as np
import torch

_OLD_COMMIT = "e0200b5"
_OLD_MODULES = ("linalg", "checks", "causal", "keysets", "effective", "certificates", "certify")


def old_attention() -> types.ModuleType:
    """The attention package of `_OLD_COMMIT` as module `_old22` (imports rewritten)."""
    if "_old22" in sys.modules:
        return sys.modules["_old22"]
    pkg = types.ModuleType("_old22")
    pkg.__path__ = []  # a package, so that `_old22.x` submodules resolve
    sys.modules["_old22"] = pkg
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in _OLD_MODULES:
        src = subprocess.run(
            ["git", "show", f"{_OLD_COMMIT}:src/identifiable/attention/{name}.py"],
            cwd=root, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        src = src.replace("identifiable.attention.", "_old22.")
        mod = types.ModuleType(f"_old22.{name}")
        mod.__file__ = f"_old22/{name}.py"
        sys.modules[mod.__name__] = mod
        exec(compile(src, mod.__file__, "exec"), mod.__dict__)
        setattr(pkg, name, mod)
    return pkg


def zipf_ids(n: int, seed: int = 0) -> list[int]:
    """[CLS] and n − 1 ids drawn with p ∝ 1/rank from 8,000 word pieces of the vocabulary."""
    rng = np.random.default_rng(seed)
    vocab = np.arange(1000, 9000)
    p = 1.0 / np.arange(1, vocab.size + 1)
    return [101, *vocab[rng.choice(vocab.size, size=n - 1, p=p / p.sum())].tolist()]


def build(kind: str):
    """(HF model, identifiable Model) for "llama" or "gemma2" (see the module docstring)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from identifiable.models import Model, embedded_model_path

    ids = {"pad_token_id": 0, "bos_token_id": 101, "eos_token_id": 102, "vocab_size": 30522}
    if kind == "llama":
        cfg = AutoConfig.for_model(
            "llama", hidden_size=4096, num_hidden_layers=2, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128, intermediate_size=14336,
            max_position_embeddings=8192, rope_theta=500000.0, **ids,
        )  # fmt: skip
    else:
        cfg = AutoConfig.for_model(
            "gemma2", hidden_size=2304, num_hidden_layers=2, num_attention_heads=8,
            num_key_value_heads=4, head_dim=256, intermediate_size=9216,
            max_position_embeddings=8192, sliding_window=512, attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0, query_pre_attn_scalar=256, **ids,
        )  # fmt: skip
    torch.manual_seed(0)
    hf = AutoModel.from_config(cfg, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(str(embedded_model_path()))
    tok.model_max_length = 8192  # the BERT tokenizer's 512 would truncate every text
    return hf, Model.from_hf(hf, tok, name=f"{kind}-2-layers-random")


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        out = None
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def sdpa_forward(hf, ids: list[int], repeats: int) -> tuple[float, str]:
    """One forward of the same weights under sdpa (no attention maps returned), or eager
    where transformers offers no sdpa for the family (Gemma-2, soft-capping)."""
    try:
        hf.set_attn_implementation("sdpa")
        impl = "sdpa"
    except ValueError:
        impl = "eager"
    x = torch.tensor([ids])
    try:
        with torch.no_grad():
            hf(x[:, :16])
            return timed(lambda: hf(x), repeats)[0], impl
    finally:
        hf.set_attn_implementation("eager")


def invariant_error(trace, effective: torch.Tensor) -> float:
    """max over heads of ‖(A_eff − A) V H‖ / ‖A V H‖ (T formed layer by layer)."""
    worst = 0.0
    for layer in range(effective.shape[0]):
        a = trace.attentions[layer].double()
        t = trace.values[layer].double() @ trace.out_proj[layer].double()
        err = ((effective[layer].double() - a) @ t).norm(dim=(-2, -1))
        worst = max(worst, float((err / (a @ t).norm(dim=(-2, -1))).max()))
        del t
    return worst


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def effective_section(kind: str, sizes, before_sizes, repeats: int) -> list[dict]:
    old = old_attention()
    hf, model = build(kind)
    rows = []
    for n in sizes:
        ids = zipf_ids(n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trace = model.trace(ids)
        assert trace.n_tokens == n, (trace.n_tokens, n)
        row = measure(trace, hf, ids, old, n in before_sizes, repeats)
        row.update(model=kind, n=n, distinct=len(set(ids)), load=load())
        print(json.dumps(row), flush=True)
        rows.append(row)
        del trace
    return rows


def measure(trace, hf, ids, old, before: bool, repeats: int) -> dict:
    """Forward, all heads in float64 and float32, each layer; before and after."""
    from identifiable.attention import effective_attention, iter_effective_attention

    fwd, impl = sdpa_forward(hf, ids, repeats)
    row: dict = {"forward": impl, "forward_s": fwd}
    routes = {"after": (effective_attention, iter_effective_attention)}
    if before:
        routes["before"] = (
            old.effective.effective_attention,
            old.effective.iter_effective_attention,
        )
    for label, dtype in (("f64", torch.float64), ("f32", torch.float32)):
        results = {}
        for side, (full, _) in routes.items():
            t, ea = timed(
                lambda f=full, d=dtype: f(trace, dtype=d), repeats if side == "after" else 1
            )
            row[f"{side}_{label}_s"], row[f"{side}_{label}_x"] = t, t / fwd
            results[side] = ea.effective
            del ea
        row[f"after_{label}_invariant"] = invariant_error(trace, results["after"])
        if before:
            row[f"max_diff_{label}"] = float((results["before"] - results["after"]).abs().max())
        del results
    for side, (_, streamed) in routes.items():
        for layer in range(trace.n_layers):
            t, _ = timed(lambda s=streamed, ly=layer: list(s(trace, layers=[ly])),
                         repeats if side == "after" else 1)  # fmt: skip
            row[f"{side}_layer{layer + 1}_s"] = t
        row[f"{side}_layer_ratio"] = row[f"{side}_layer1_s"] / row[f"{side}_layer2_s"]
    return row


def certify_section(repeats: int, before: bool) -> dict:
    """Causal certificates on the Llama-style trace at n = 512, layer 2, head 0."""
    from identifiable.attention import attention_intervals, interval_map, lockstep
    from identifiable.errors import IdentifiableError

    lockstep.ensure_compiled()  # once per install (cached on disk): outside the timings
    _, model = build("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = model.trace(zipf_ids(512))
    out: dict = {"load": load()}
    t, res = timed(lambda: attention_intervals(trace, 1, 0, 511), repeats)
    out["row512_after_s"], out["row512_lps"] = t, res.lp_solved
    if before:  # HiGHS per key (the issue measured 281 s)
        t, _ = timed(lambda: old_attention().certify.attention_intervals(trace, 1, 0, 511), 1)
        out["row512_before_s"] = t
    for label, kwargs in (("layer", {"layers": [1]}), ("head", {"layers": [1], "heads": [0]})):
        t0 = time.perf_counter()
        try:
            interval_map(trace, time_budget=30, **kwargs)
            out[f"budget30_{label}"] = "returned"
        except IdentifiableError as exc:
            out[f"budget30_{label}"] = str(exc)
        out[f"budget30_{label}_s"] = time.perf_counter() - t0
    print(json.dumps(out), flush=True)
    return out


def encoder_section(repeats: int) -> dict:
    """No regression on encoders: BERT-base-sized effective attention (n = 512, the default
    float64 call and float32) and a whole MiniLM head's interval map (n ≈ 128), before and
    after, interleaved."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_attention import build_trace, time_forward
    from identifiable.attention import effective_attention, interval_map
    from identifiable.models import load_model

    old = old_attention()
    hf, trace = build_trace()
    fwd = time_forward(hf, trace.input_ids, repeats)
    out: dict = {"forward_s": fwd, "load": load()}
    routes = (("before", old.effective.effective_attention), ("after", effective_attention))
    for label, dtype in (("f64", torch.float64), ("f32", torch.float32)):
        times: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(repeats):  # interleaved: before, after, before, after, ...
            for side, fn in routes:
                times[side].append(timed(lambda f=fn, d=dtype: f(trace, dtype=d), 1)[0])
        for side, ts in times.items():
            out[f"bert_{side}_{label}_x"] = statistics.median(ts) / fwd
    minilm = load_model("minilm")
    text = " ".join(["the quick brown fox jumps over the lazy dog, and then it runs."] * 9)
    mtrace = minilm.trace(text)
    out["minilm_n"] = mtrace.n_tokens
    for side, fn in (("before", old.certify.interval_map), ("after", interval_map)):
        t, _ = timed(lambda f=fn: f(mtrace, layers=[2], heads=[0]), 1)
        out[f"minilm_head_{side}_s"] = t
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[512, 1024, 2048])
    p.add_argument("--before-n", type=int, nargs="*", default=[512, 1024])
    p.add_argument("--sections", nargs="+", default=["effective", "windows", "certify"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--before-certify", action="store_true", help="HiGHS per key: minutes")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out: dict = {"threads": args.threads, "commit_before": _OLD_COMMIT}
    if "effective" in args.sections:
        out["effective"] = effective_section("llama", args.n, set(args.before_n), args.repeats)
    if "windows" in args.sections:  # n > the window of 512
        sizes = [n for n in args.n if n > 512]
        out["windows"] = effective_section("gemma2", sizes, set(args.before_n), args.repeats)
    if "encoder" in args.sections:
        out["encoder"] = encoder_section(args.repeats)
    if "certify" in args.sections:
        out["certify"] = certify_section(args.repeats, args.before_certify)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
