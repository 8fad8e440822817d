"""Experiments: one module per paper figure family, each producing tidy tables."""
