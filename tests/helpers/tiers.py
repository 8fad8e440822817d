"""Test tiers from measured durations: `make test-fast` runs the unit tier, `make test` all.

A test joins the full tier only (marker `slow`) when it is marked integration, browser or
distributed, or when its last recorded run took longer than `FAST_LIMIT_S` (setup, call and
teardown together; `tests/durations.json`). A test with no record is in the fast tier until
one exists. `make test-durations` runs the whole suite once and rewrites the record, so the
tiers follow the suite as it grows; the record keeps the tests over half the limit (seconds,
rounded to 0.01), a newer measurement replacing an older one.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

RECORD = Path(__file__).resolve().parents[1] / "durations.json"
FAST_LIMIT_S = 0.5
# markers whose tests are never in the fast tier, whatever they took
FULL_ONLY = ("integration", "browser", "distributed")
# where `make test-durations` asks for the record to be written
WRITE_ENV = "IDENTIFIABLE_WRITE_DURATIONS"

_seconds: dict[str, float] = defaultdict(float)


def _recorded() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(RECORD.read_text("utf-8")).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: the full tier only (make test, not make test-fast)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    recorded = _recorded()
    for item in items:
        marked = any(item.get_closest_marker(m) for m in FULL_ONLY)
        if marked or recorded.get(item.nodeid, 0.0) > FAST_LIMIT_S:
            item.add_marker(pytest.mark.slow)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid] += report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get(WRITE_ENV)
    if not target or not _seconds:
        return
    merged = {**_recorded(), **{k: round(v, 2) for k, v in _seconds.items()}}
    kept = {k: v for k, v in sorted(merged.items()) if v > FAST_LIMIT_S / 2}
    Path(target).write_text(json.dumps(kept, indent=0) + "\n", "utf-8")
