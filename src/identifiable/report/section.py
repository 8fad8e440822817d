"""One section of the report page: its words, figures, verdicts and tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from identifiable.report.verdicts import Verdict

if TYPE_CHECKING:  # pandas is not imported at run time here: the CLI starts without it
    import pandas as pd


@dataclass
class Section:
    key: str
    title: str
    claim: str
    explain: str
    figures: list[tuple[str, bytes, str]]  # (stem, png, caption)
    verdicts: list[Verdict]
    tables: list[tuple[str, pd.DataFrame]]
