"""Cost of null-space-aware training, and of fingerprints that see every weight.

1. Step: one fine-tuning step (forward, self-distillation loss, backward, AdamW) with the
   null-attention penalty on every head of every layer, against the same step without it,
   on the same batch (all-MiniLM-L6-v2, 8 Wikipedia pairs of ≤ 72 tokens), same threads,
   interleaved, the fastest of `--repeats` each. Target (issue 24): ≤ 1.5×.
2. Fingerprint: `Model.fingerprint` (XXH3-128 of every tensor) on MiniLM and on a
   BERT-base-sized random model, beside SHA-256 over the same bytes and one forward pass.

    python benchmarks/bench_training.py [--threads 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch


def fastest(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def step_ratio(repeats: int) -> dict[str, float]:
    from identifiable.corpus import load_documents, make_pairs
    from identifiable.models import load_model
    from identifiable.training import null_attention_penalty
    from identifiable.training.loop import encode_batch, fidelity_loss

    m = load_model("minilm")
    pairs = make_pairs(load_documents()[:10], m.tokenizer, max_tokens=72, min_tokens=40)[:8]
    batch = encode_batch(m, pairs)
    with torch.no_grad():
        target = m.hf_model(**batch).last_hidden_state + 0.01
    opt = torch.optim.AdamW(m.hf_model.parameters(), lr=1e-12, eps=1e-6)

    def plain() -> None:
        out = m.hf_model(**batch)
        loss = sum(fidelity_loss(out.last_hidden_state, target, batch["attention_mask"]))
        opt.zero_grad()
        loss.backward()
        opt.step()

    def penalised() -> None:
        r = null_attention_penalty(m, batch, return_outputs=True)
        h = r.outputs.last_hidden_state
        loss = sum(fidelity_loss(h, target, batch["attention_mask"])) + 0.1 * r.penalty
        opt.zero_grad()
        loss.backward()
        opt.step()

    plain(), penalised()  # warm-up
    times = {"plain": float("inf"), "penalty": float("inf")}
    for _ in range(repeats):  # interleaved: load changes hit both sides alike
        times["plain"] = min(times["plain"], fastest(plain, 1))
        times["penalty"] = min(times["penalty"], fastest(penalised, 1))
    return {
        "tokens": int(batch["attention_mask"].sum()),
        "padded": list(batch["input_ids"].shape),
        "plain_s": times["plain"],
        "penalty_s": times["penalty"],
        "ratio": times["penalty"] / times["plain"],
    }


def fingerprint_cost(repeats: int) -> dict[str, dict[str, float]]:
    from transformers import AutoConfig, AutoModel

    from identifiable.models import Model, load_model
    from identifiable.models.fingerprint import model_fingerprint

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "bert",
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
    )
    models = {
        "minilm": load_model("minilm").hf_model,
        "bert-base-sized": AutoModel.from_config(cfg, attn_implementation="eager").eval(),
    }
    out = {}
    for name, hf in models.items():
        n_bytes = sum(t.numel() * t.element_size() for t in hf.state_dict().values())

        def sha(hf=hf) -> None:
            h = hashlib.sha256()
            for t in hf.state_dict().values():
                h.update(memoryview(t.detach().contiguous().view(torch.uint8).numpy()))

        ids = torch.randint(1000, 2000, (1, 128))
        with torch.no_grad():
            fwd = fastest(lambda hf=hf, ids=ids: hf(input_ids=ids), repeats)
        fp = fastest(lambda hf=hf: model_fingerprint(hf), repeats)
        out[name] = {
            "mbytes": n_bytes / 2**20,
            "fingerprint_s": fp,
            "sha256_s": fastest(sha, repeats),
            "forward_n128_s": fwd,
            "fingerprint_per_forward": fp / fwd,
        }
        assert Model.from_hf(hf).fingerprint == model_fingerprint(hf)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = {
        "threads": args.threads,
        "step": step_ratio(args.repeats),
        "fingerprint": fingerprint_cost(args.repeats),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
