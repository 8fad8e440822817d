"""Tiny GGUF files written with the `gguf` package, as llama.cpp lays them out: a 2-layer
Llama (width 64, 4 query and 2 key/value heads) with a byte-level BPE tokenizer, its
matrices quantized (Q4_1 by default), for loading, caching and bad-input tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

WIDTH, FF, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
MERGES = ["t h", "th e", "Ġ the", "a n", "an d", "Ġ and"]


def _byte_tokens() -> list[str]:
    """The 256 byte-level symbols of GPT-2's BPE, in byte order."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def vocabulary() -> list[str]:
    return [*_byte_tokens(), *(m.replace(" ", "") for m in MERGES), "<|endoftext|>"]


def write_tiny_gguf(
    path: Path,
    *,
    quant: str = "Q4_1",
    arch: str = "llama",
    merges: bool = True,
    seed: int = 0,
) -> Path:
    """Write the tiny model to `path`; `quant` is the matrices' type ("Q8_1": a type the
    gguf package cannot dequantize, written as raw blocks), `merges=False` leaves the
    tokenizer's merges out."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    tokens = vocabulary()
    qtype = GGMLQuantizationType[quant]
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(WIDTH)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(getattr(LlamaFileType, f"MOSTLY_{quant}", LlamaFileType.ALL_F32))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    if merges:
        w.add_token_merges(MERGES)
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 1)

    def matrix(name: str, rows: int, cols: int) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)
        if qtype == GGMLQuantizationType.F32:
            w.add_tensor(name, data)
        elif quant == "Q8_1":  # no quantizer: raw bytes of the right size
            block, nbytes = GGML_QUANT_SIZES[qtype]
            raw = rng.integers(0, 255, (rows, cols // block * nbytes), dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=qtype)
        else:
            w.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)

    def norm(name: str) -> None:
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(WIDTH)).astype(np.float32))

    head_dim = WIDTH // HEADS
    matrix("token_embd.weight", len(tokens), WIDTH)
    for i in range(LAYERS):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", WIDTH, WIDTH)
        matrix(f"blk.{i}.attn_k.weight", KV_HEADS * head_dim, WIDTH)
        matrix(f"blk.{i}.attn_v.weight", KV_HEADS * head_dim, WIDTH)
        matrix(f"blk.{i}.attn_output.weight", WIDTH, WIDTH)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", FF, WIDTH)
        matrix(f"blk.{i}.ffn_up.weight", FF, WIDTH)
        matrix(f"blk.{i}.ffn_down.weight", WIDTH, FF)
    norm("output_norm.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
