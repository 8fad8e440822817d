"""`layers=` and `heads=` of `Model.trace` and `Model.iter_layers`, checked before any work.

Python callers read the argument names (`layers=`), the CLI its flags (`--layers`); both
get one line for an index out of range, a repeat, an empty or a non-integer selection.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from identifiable.errors import IdentifiableError
from identifiable.utils.checks import indices as checked_indices


def _fail(python: str, cli: str, what: str) -> IdentifiableError:
    return IdentifiableError(what.format(python), cli=what.format(cli))


def indices(values: Iterable[int] | None, count: int, name: str) -> list[int] | None:
    """The chosen indices in 0..count−1, as a list (None: all of them)."""
    if values is None:
        return None
    out = checked_indices(values, count, name)  # the one rule of the API and the CLI
    return None if sorted(out) == list(range(count)) and name == "layers" else out


def layer_range(layers: list[int] | None, count: int) -> range:
    """A trace's layers must follow each other (its hidden states run from the input of
    its first layer to the output of its last)."""
    if layers is None:
        return range(count)
    chosen = sorted(layers)
    if chosen != list(range(chosen[0], chosen[-1] + 1)) or chosen != layers:
        raise _fail(
            "layers=",
            "--layers",
            "trace {} takes consecutive layers in order, e.g. "
            + f"{[chosen[0], chosen[0] + 1]} (a trace's hidden states run from the input of "
            "its first layer to the output of its last); iter_layers streams any layers",
        )
    return range(chosen[0], chosen[-1] + 1)


@dataclass(frozen=True)
class Selection:
    """What each batch of `Model.trace_many` keeps: `layers` (consecutive, the model's
    indices), `heads` (None: all) and the `memory_budget` in bytes (None: memory
    available at each batch)."""

    layers: range
    heads: list[int] | None
    memory_budget: int | None
