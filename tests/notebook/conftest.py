"""The browser fixtures of tests/report (Debian's Chromium through Playwright)."""

from report.conftest import browser  # noqa: F401 - a fixture, used by name
