"""Helpers shared by the tests, imported by module (`from helpers.families import ...`).

- `families`: the one family list (`TINY_CONFIGS`) and the tiny random models built from it;
- `cli`: the real CLI entry point in-process, the installed script, the refusal contract;
- `corpora`: small synthetic corpora and a tiny model saved as a user's model folder;
- `traces`: synthetic traces and exact ranks (attention tests);
- `hta_toy`: a toy model with a closed-form Jacobian (attribution tests);
- `token_pairs`: synthetic `TokenPairs` with known structure (token tests);
- `training`: texts long enough to have null attention, and padded batches.
"""
