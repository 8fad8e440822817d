"""Small utilities every floor may use; each imports at most `identifiable.errors` and torch.

- `progress`: the one progress helper (rich bars on stderr, lines in a log);
- `threads`: one intra-op torch thread around kernels that alternate with numpy;
- `precision`: the float32 matmul precision torch is set to;
- `seeds`: the seed range and seeds derived for a layer;
- `unicode`: text a tokenizer can take (no lone surrogates).
"""
