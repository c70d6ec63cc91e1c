"""A headless Chromium for screenshots of the reports (and the tests that look at them).

Uses the system's Chromium (Debian's ``chromium``; ``make sysdeps`` installs it) driven by the
Playwright package, never a browser Playwright downloads. ``find_chromium`` says why it cannot be
had (for a test's skip reason or the demo's one line); ``open_page`` yields a page of a given
viewport; ``screenshot`` is a full-page PNG of an HTML file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from laggard.errors import LaggardError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
VIEWPORT = {"width": 1280, "height": 1000}  # a laptop screen; the report's content is 1,160 px wide
LOAD_TIMEOUT_MS = 30_000  # a cold start of Chromium on a busy 2-core machine takes seconds


def find_chromium() -> tuple[str | None, str]:
    """(path of a Chromium executable or None, why not). ``LAGGARD_CHROMIUM`` overrides the search."""
    env = os.environ.get("LAGGARD_CHROMIUM")
    if env:
        return (env, "") if Path(env).exists() else (None, f"LAGGARD_CHROMIUM={env} does not exist")
    exe = next((p for p in map(shutil.which, CANDIDATES) if p), None)
    if exe is None:
        return None, "no chromium on PATH (Debian: apt-get install chromium; `make sysdeps` does it as root)"
    try:
        import playwright.sync_api  # noqa: F401
    except ModuleNotFoundError:
        return None, "the playwright package is not installed (pip install 'laggard[dev]')"
    return exe, ""


@contextlib.contextmanager
def open_page(viewport: dict[str, int] | None = None) -> Iterator[Any]:
    """A Playwright page in a headless system Chromium; LaggardError when none can be had."""
    exe, why = find_chromium()
    if exe is None:
        raise LaggardError(f"no browser for screenshots: {why}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport=viewport or VIEWPORT)
            page.set_default_timeout(LOAD_TIMEOUT_MS)
            yield page
        finally:
            browser.close()


def screenshot(html: str | Path, png: str | Path, *, full_page: bool = True) -> Path:
    """Load ``html`` (a file) in headless Chromium and save a PNG of the page to ``png``."""
    out = Path(png)
    with open_page() as page:
        page.goto(Path(html).resolve().as_uri())
        page.wait_for_load_state("load")
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=full_page)
    return out


__all__ = ["find_chromium", "open_page", "screenshot"]
