"""Experiments: one module per paper figure family, each producing tidy tables.

Each module holds the `reproduce` stage of its family (shard → tables, then a reduce) and,
for Figs. 1 and 3-4, a public one-call form on texts of your own:
`experiments.attention.attention_experiment(model, texts)` and
`experiments.attribution.run_attribution_experiment(model, texts)` (docs/api).
"""
