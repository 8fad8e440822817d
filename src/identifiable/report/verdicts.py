"""The verdict record shared by every claim module: a status, a sentence, the numbers.

Every rule decides on intervals, not points: a claim's condition holds when the 95 %
interval of its statistic lies wholly on the claim's side of the threshold, fails when it
lies wholly on the other side, and is open when it straddles. A status that depends on an
open condition is "not settled" (`settle`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SUPPORTED, PARTLY, NOT_SUPPORTED, NOT_TESTED, NOT_SETTLED = (
    "supported",
    "partly supported",
    "not supported",
    "not tested",
    "not settled",
)
LEVEL = 0.95  # every interval of a verdict is a 95 % interval

# The claims of Brunner et al. (ICLR 2020); every other verdict is ours ("beyond the paper").
PAPER_CLAIMS = (
    "fig1a",
    "fig1bc",
    "fig2a_cos",
    "fig2a_depth",
    "fig2b",
    "fig3a",
    "fig3b",
    "fig4a",
    "fig4b",
)


@dataclass
class Verdict:
    key: str
    status: str
    sentence: str
    numbers: dict[str, Any] = field(default_factory=dict)


def _f(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def side(lo: float, hi: float, threshold: float, *, below: bool = False) -> bool | None:
    """Whether the interval [lo, hi] lies on the claim's side of `threshold` (at or above
    it; at or below it with `below`): True, False when it lies wholly on the other side,
    None when it straddles the threshold."""
    if below:
        lo, hi, threshold = -hi, -lo, -threshold
    if lo >= threshold:
        return True
    if hi < threshold:
        return False
    return None


def settle(rule: Callable[[Sequence[bool]], str], outcomes: Sequence[bool | None]) -> str:
    """`rule`'s status when every open outcome (None) could go either way: the status if
    it is the same with all open outcomes passing and all failing, else NOT_SETTLED."""
    best = rule([o is not False for o in outcomes])
    worst = rule([o is True for o in outcomes])
    return best if best == worst else NOT_SETTLED


def _pass_fail(ok: Sequence[bool]) -> str:
    return SUPPORTED if ok[0] else NOT_SUPPORTED


def one_test(ok: bool | None) -> str:
    """The status of a claim decided by one interval test: supported when it holds, not
    supported when it fails, not settled when it is open (None)."""
    return settle(_pass_fail, [ok])


def outcome(ok: bool | None, yes: str, no: str, open_: str = ": the sample cannot tell.") -> str:
    """The end of a verdict's sentence for one test's outcome (held, failed, open)."""
    return yes if ok else no if ok is False else open_


def _halves(ok: Sequence[bool]) -> str:
    return SUPPORTED if all(ok) else PARTLY if any(ok) else NOT_SUPPORTED


def both_halves(first: bool | None, second: bool | None) -> str:
    """The status of a claim tested in two halves: supported when both hold, partly when one
    does, not supported when neither; not settled when an open half (None) decides it."""
    return settle(_halves, [first, second])


def binomial_interval(k: int, n: int) -> tuple[float, float]:
    """The exact (Clopper-Pearson) 95 % interval of a proportion k / n."""
    from scipy.stats import binomtest

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=LEVEL, method="exact")
    return float(ci.low), float(ci.high)


def median_interval(values: Any) -> tuple[float, float]:
    """The distribution-free 95 % interval of a median: order statistics x_(j) and
    x_(n+1−j) with j from the Binomial(n, ½) quantile (exact; assumes independent
    values). Below 6 values no such interval exists: (−inf, inf)."""
    from scipy.stats import binom

    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    j = int(binom.ppf((1 - LEVEL) / 2, n, 0.5))  # P(B < j) ≤ 2.5 %
    if n < 6 or j < 1:
        return float("-inf"), float("inf")
    return float(x[j - 1]), float(x[n - j])


def spearman_interval(rho: float, n: int) -> tuple[float, float]:
    """The 95 % interval of a Spearman ρ on n pairs by Fisher's z with the variance
    1.06 / (n − 3) of Fieller, Hartley and Pearson (1957); (−1, 1) below 4 pairs."""
    if n < 4:
        return -1.0, 1.0
    z = float(np.arctanh(np.clip(rho, -0.999999, 0.999999)))
    half = 1.959963984540054 * float(np.sqrt(1.06 / (n - 3)))
    return float(np.tanh(z - half)), float(np.tanh(z + half))


def judged(key: str, status: str, sentence: str, numbers: dict[str, Any]) -> Verdict:
    """A verdict whose sentence opens with its status ("Supported: …")."""
    return Verdict(key, status, f"{status.capitalize()}: {sentence}", numbers)


def tally(verdicts: Sequence[Verdict]) -> dict[str, dict[str, int]]:
    """Counts of the paper's claims and ours ("beyond"): claims, tested, supported,
    not_settled (tested = every status but "not tested")."""
    out = {}
    for part, mine in (("paper", True), ("beyond", False)):
        vs = [v for v in verdicts if (v.key in PAPER_CLAIMS) == mine]
        out[part] = {
            "claims": len(vs),
            "tested": sum(v.status != NOT_TESTED for v in vs),
            "supported": sum(v.status == SUPPORTED for v in vs),
            "not_settled": sum(v.status == NOT_SETTLED for v in vs),
        }
    return out


def difference_interval(
    p1: float, lo1: float, hi1: float, p2: float, lo2: float, hi2: float
) -> tuple[float, float]:
    """The 95 % interval of p1 − p2 from the two proportions' own 95 % (Wilson) intervals,
    by Newcombe's hybrid score method (1998, method 10)."""
    d = p1 - p2
    return (
        d - float(np.hypot(p1 - lo1, hi2 - p2)),
        d + float(np.hypot(hi1 - p1, p2 - lo2)),
    )


NOT_EVIDENCE = "pipeline check, not evidence"
PIPELINE_CHECK = (
    "Pipeline check, not evidence: this budget only proves that every stage runs end to end. "
    "Its samples are far too small for findings, so no claim is tested here: the sentences "
    "below show what the rules computed, not what the model does. Run the quick or paper "
    "budget for findings."
)


def pipeline_check(settings: dict[str, Any]) -> bool:
    """Whether the run's budget is a pipeline check (smoke), whose verdicts are no findings."""
    return bool(settings.get("budget", {}).get("pipeline_check", False))


def _count(label: str, c: dict[str, int]) -> str:
    extra = [f"{c['not_settled']} not settled"] if c["not_settled"] else []
    extra += [f"{c['claims'] - c['tested']} not tested"] if c["claims"] > c["tested"] else []
    return f"{label}: {c['supported']} of {c['tested']} supported" + "".join(
        f", {e}" for e in extra
    )


def headline(summary: dict[str, Any]) -> str:
    """The one-line result: the paper's claims and ours counted apart ("paper: 7 of 9
    supported; beyond: 4 of 5 supported"), or for a pipeline check that it is one."""
    if summary.get("pipeline_check"):
        return f"{NOT_EVIDENCE} (smoke budget: no claim tested, samples too small for findings)"
    counts = summary.get("counts")
    if not counts:  # a summary written before the paper's claims and ours were counted apart
        return f"{summary['supported']} of {summary['claims_tested']} tested claims supported"
    return "; ".join(
        _count(label, counts[part])
        for part, label in (("paper", "paper"), ("beyond", "beyond"))
        if counts[part]["claims"]
    )
