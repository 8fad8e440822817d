"""The verdict record shared by every claim module: a status, a sentence, the numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED, PARTLY, NOT_SUPPORTED, NOT_TESTED = (
    "supported",
    "partly supported",
    "not supported",
    "not tested",
)


@dataclass
class Verdict:
    key: str
    status: str
    sentence: str
    numbers: dict[str, Any] = field(default_factory=dict)


def _f(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def both_halves(first: bool, second: bool) -> str:
    """The status of a claim tested in two halves: supported when both hold, partly when one
    does, not supported when neither."""
    return SUPPORTED if first and second else PARTLY if first or second else NOT_SUPPORTED


def judged(key: str, status: str, sentence: str, numbers: dict[str, Any]) -> Verdict:
    """A verdict whose sentence opens with its status ("Supported: …")."""
    return Verdict(key, status, f"{status.capitalize()}: {sentence}", numbers)
