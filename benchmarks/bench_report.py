"""Viewer page size and build time at 512 tokens, measured side by side.

Models: BERT-base dimensions with random weights (12 layers × 12 heads, d_v = 64; near-uniform
attention, the incompressible worst case) and the embedded all-MiniLM-L6-v2 (6 × 12, d_v = 32).
For each, prints the page size against what storing every head's raw + effective attention
would take as float32 and as uint8 codes, and how many heads fit the 9 MB budget at full
resolution (the others are embedded as block-mean previews). Writes the MiniLM page to
artifacts/viewer-minilm-512.html.

    python benchmarks/bench_report.py
"""

from __future__ import annotations

import time
from pathlib import Path

import torch


def long_text(tokenizer, n_tokens: int) -> str:
    from identifiable.corpus import load_corpus

    words: list[str] = []
    for item in load_corpus(limit=400):
        words += (item if isinstance(item, str) else " ".join(item)).split()
        if len(tokenizer(" ".join(words))["input_ids"]) > n_tokens + 20:
            break
    return " ".join(words)


def measure(model, text: str, label: str, save: str | None = None) -> None:
    from identifiable.viewer.build import viewer_html_for_trace
    from identifiable.viewer.page import read_viewer_data

    trace = model.trace(text)
    n, n_layers, n_heads = trace.n_tokens, trace.n_layers, trace.n_heads
    start = time.perf_counter()
    html = viewer_html_for_trace(trace, layer=0, head=0, max_rows=4, interval_seconds=20)
    seconds = time.perf_counter() - start
    if save:
        Path(save).parent.mkdir(exist_ok=True)
        Path(save).write_text(html, "utf-8")
    (data,) = read_viewer_data(html)
    size = len(html.encode("utf-8"))
    full = sum(1 for e in data["matrices"].values() if e["f"] == 1)
    block = max(e["f"] for e in data["matrices"].values())
    float32 = 2 * 4 * n_layers * n_heads * n * n  # raw + effective, every head
    uint8 = float32 // 4
    print(
        f"{label}: n = {n}, {n_layers}×{n_heads} heads; page {size / 1e6:.2f} MB "
        f"({full}/{n_layers * n_heads} heads at full resolution, the rest as {block}×{block}-block "
        f"previews; "
        f"{len(data['intervals'])} rows certified) in {seconds:.1f} s; "
        f"all heads as float32 would be {float32 / 1e6:.0f} MB ({float32 / size:.0f}× larger), "
        f"as uint8 {uint8 / 1e6:.0f} MB ({uint8 / size:.1f}× larger)"
    )


def main() -> None:
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from identifiable.models import Model, embedded_model_path, load_model

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_path()))
    text = long_text(tokenizer, 512)
    base = AutoModel.from_config(AutoConfig.for_model("bert"), attn_implementation="eager").eval()
    measure(
        Model.from_hf(base, tokenizer, name="bert-base-random"),
        text,
        "BERT-base dims, random weights",
    )
    measure(load_model("minilm"), text, "all-MiniLM-L6-v2", save="artifacts/viewer-minilm-512.html")


if __name__ == "__main__":
    main()
