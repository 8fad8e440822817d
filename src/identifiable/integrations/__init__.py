"""Bridges to the tools researchers already use beside identifiable; optional extras each.

- `lens`: a `Trace` from a TransformerLens `TransformerBridge` run (`trace_from_lens`);
- `nnsight`: a `Trace` of the model inside an nnsight wrapper (`trace_from_nnsight`);
- `inseq`: effective attention and HTA as inseq attribution methods (`register_inseq`).

bertviz needs no bridge: `Result.to_bertviz(field)` gives its input. Nothing below this
floor imports these modules.
"""
