"""Browser harness for the report and viewer tests: Debian's Chromium driven by Playwright.

Registered for the whole suite by `pytest_plugins` in tests/conftest.py.

Chromium is not optional here: CI installs it, and a missing browser must fail
loudly (with the install line) rather than skip the tests that prove the pages work.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
INSTALL_HINT = (
    "headless Chromium is required for the browser tests: "
    "`apt-get update && apt-get install -y chromium` and `pip install playwright==1.65.2` "
    "(do not run `playwright install`; the tests use /usr/bin/chromium)"
)
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@dataclass
class LoadedPage:
    """A page plus everything it reported while loading and being used."""

    page: Any
    console_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / name
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(INSTALL_HINT + " — the playwright package is missing", pytrace=False)
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        pytest.fail(INSTALL_HINT + f" — {CHROMIUM} not found", pytrace=False)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    """`open_page(path)` → LoadedPage; records console errors, dialogs and non-file requests."""
    contexts = []

    def _open(path: Path, wait_ready: bool = True) -> LoadedPage:
        ctx = browser.new_context(viewport={"width": 1300, "height": 900})
        contexts.append(ctx)
        page = ctx.new_page()
        loaded = LoadedPage(page)
        page.on(
            "console", lambda m: loaded.console_errors.append(m.text) if m.type == "error" else None
        )
        page.on("pageerror", lambda e: loaded.console_errors.append(f"uncaught: {e}"))

        def on_dialog(d: Any) -> None:
            loaded.dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", on_dialog)
        page.on(
            "request",
            lambda r: (
                loaded.requests.append(r.url)
                if not r.url.startswith(("file:", "data:", "blob:"))
                else None
            ),
        )
        page.goto(Path(path).resolve().as_uri())
        if wait_ready:
            page.wait_for_selector("body[data-ready='1']", timeout=15_000)
        return loaded

    yield _open
    for ctx in contexts:
        ctx.close()
