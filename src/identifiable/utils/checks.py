"""Argument checks shared by the Python API and the CLI: one rule for each kind of argument.

Each check raises `IdentifiableError` worded twice: with the Python argument (`workers=`)
for callers of the API, and with the flag (`--workers`) that `IdentifiableError.for_cli`
gives the command line, so that `interval_map(trace, workers=0)` and `certify --workers 0`
refuse by the same rule. Objects of the wrong kind (a `Model` where a `Trace` belongs,
None, a number) are named by their type, with what to pass instead.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable
from typing import Any

import torch

from identifiable.errors import IdentifiableError


def shown(value: Any) -> str:
    """A value as a message names it: its type, and short values themselves."""
    if value is None:
        return "None"
    kind = type(value).__name__
    if isinstance(value, bool | int | float | str | bytes):
        text = repr(value)
        return f"{kind} {text[:40]}{'…' if len(text) > 40 else ''}"
    if isinstance(value, list | tuple | dict | set) and not value:
        return f"an empty {kind}"
    return f"a {kind}"


def _error(python: str, cli: str | None) -> IdentifiableError:
    return IdentifiableError(python, cli=cli)


def expect(value: Any, kinds: type | tuple[type, ...], name: str, what: str) -> None:
    """Refuse `value` unless it is one of `kinds`: "`name`= takes `what`, got …"."""
    if not isinstance(value, kinds):
        raise IdentifiableError(f"{name}= takes {what}, got {shown(value)}")


def whole(value: Any, name: str, flag: str | None = None) -> int:
    """`value` as an int: Python and numpy integers pass, bools, floats and text do not."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        got = shown(value)
        raise _error(
            f"{name}= takes a whole number, got {got}",
            None if flag is None else f"{flag} takes a whole number, got {got}",
        ) from None


def count(
    value: Any, name: str, flag: str | None = None, *, minimum: int = 1, maximum: int | None = None
) -> int:
    """A whole number in `minimum`..`maximum` (workers, threads, steps, …)."""
    n = whole(value, name, flag)
    if n < minimum or (maximum is not None and n > maximum):
        span = f"at least {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise _error(
            f"{name}={n} must be {span}", None if flag is None else f"{flag} {n} must be {span}"
        )
    return n


def number(
    value: Any,
    name: str,
    flag: str | None = None,
    *,
    low: float = 0.0,
    high: float = math.inf,
    low_open: bool = False,
) -> float:
    """A finite real number in [low, high] (`low_open`: (low, high]); NaN and inf refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        got = shown(value)
        raise _error(
            f"{name}= takes a number, got {got}",
            None if flag is None else f"{flag} takes a number, got {got}",
        )
    x = float(value)
    inside = (x > low if low_open else x >= low) and x <= high
    if not (math.isfinite(x) and inside):
        bound = "above" if low_open else "at least"
        span = f"{bound} {low:g}" if high == math.inf else f"between {low:g} and {high:g}"
        given = f"{x:g}"
        raise _error(
            f"{name}={given} must be a finite number {span}",
            None if flag is None else f"{flag} {given} must be a finite number {span}",
        )
    return x


def indices(values: Any, size: int, name: str, flag: str | None = None) -> list[int]:
    """Chosen indices in 0..size−1 (layers, heads, rows), as a list: one line for a value
    that is not a list of integers, an empty list, a repeated or an out-of-range index."""
    flag = flag or f"--{name}"
    python = f"{name}="

    def fail(text: str) -> IdentifiableError:
        return _error(text.format(python), text.format(flag))

    if isinstance(values, int | str | bytes | torch.Tensor) or not isinstance(values, Iterable):
        raise fail("{} takes a list of integers, got " + shown(values))
    out: list[int] = []
    for v in values:
        try:
            if isinstance(v, bool):
                raise TypeError
            out.append(operator.index(v))
        except TypeError:
            raise fail("{} holds integers, got " + f"{type(v).__name__} {v!r}"[:60]) from None
    if not out:
        raise fail("{} is empty: give at least one index, or leave it out for all")
    if len(set(out)) != len(out):
        raise fail("{} repeats an index: " + str(out)[:80])
    bad = [i for i in out if not 0 <= i < size]
    if bad:
        valid = f"out of range: valid {name} are 0..{size - 1}"
        raise _error(f"{python} holds {bad[0]}, {valid}", f"{flag} {bad[0]} is {valid}")
    return out


def collection(value: Any, name: str, what: str) -> list[Any]:
    """A non-empty list, tuple or other iterable that is not text, as a list."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise IdentifiableError(f"{name}= takes {what}, got {shown(value)}")
    out = list(value)
    if not out:
        raise IdentifiableError(f"{name}= is empty: give {what}")
    return out


def choices(values: Any, allowed: tuple[str, ...], name: str) -> list[str]:
    """A non-empty list of names, each one of `allowed` (probe kinds, objectives, …)."""
    what = f"a list of one or more of {', '.join(allowed)}"
    if isinstance(values, str):
        raise IdentifiableError(f"{name}= takes {what}, got the string {values!r:.40}")
    out = collection(values, name, what)
    bad = [v for v in out if not isinstance(v, str) or v not in allowed]
    if bad:
        raise IdentifiableError(f"{name}= holds {bad[0]!r:.40}: choose from {', '.join(allowed)}")
    return out


# ---- weights ------------------------------------------------------------------------


def nonfinite_parameters(module: torch.nn.Module) -> tuple[list[str], int]:
    """(names of the parameters holding NaN or inf, number of parameters). One reduction per
    tensor; the elementwise check runs only where the sum is not finite (it may overflow)."""
    bad, total = [], 0
    for name, p in module.named_parameters():
        total += 1
        if p.device.type == "meta" or not p.is_floating_point():
            continue
        with torch.no_grad():
            if not bool(torch.isfinite(p.sum())) and not bool(torch.isfinite(p).all()):
                bad.append(name)
    return bad, total


DAMAGED = (
    "the checkpoint is damaged (a fine-tune that diverged?) and no dtype makes it finite: "
    "load or re-create a checkpoint with finite weights"
)
"""What to do about a model whose weights are not finite (trace, compare, reproduce)."""


def check_finite_weights(module: torch.nn.Module, what: str, advice: str = DAMAGED) -> None:
    """One line naming the non-finite weights of `module` (`what`: the model's name), and
    `advice`: what to do about them."""
    bad, total = nonfinite_parameters(module)
    if bad:
        raise IdentifiableError(
            f"the weights of {what} hold NaN or inf ({len(bad)} of {total} tensors, the first "
            f"{bad[0]}): {advice}"
        )
