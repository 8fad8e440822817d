"""The paper's BERT-base numbers, shipped with the package.

`assets/paper_reference.json` is a copy of the project's shared reference file:
values read off the published figures of Brunner et al. (ICLR 2020) by eye, about
±0.02 (rates) or ±1 percentage point. Everything shown from it is labelled so.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from identifiable.report.html import asset

PAPER_LABEL = "paper, BERT-base (read off its figures, ±0.02)"


@cache
def paper_reference() -> dict[str, Any]:
    """The parsed reference file (cached; treat as read-only)."""
    return json.loads(asset("paper_reference.json"))


def paper_head_dim() -> int:
    return int(paper_reference()["model"]["head_dim"])
