"""What the viewer's browser tests share: a headless Chromium, and screenshots of its pages.

The browser is Debian's Chromium (``make install`` installs it where apt-get can), driven by
Playwright, whose wheel carries its own driver. Where either is missing the browser tests skip,
saying which.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import REPO

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = "/usr/bin/chromium"
#: The flags that work here: no sandbox (we are root), no GPU, and nothing reaching outside.
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
#: Set (to a folder of the repository) by ``make viewer-screenshots``: the docs' pictures.
SCREENSHOTS_ENV = "VIEWER_SCREENSHOTS"


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """A headless Chromium with a profile of its own, for the module's tests."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no {CHROMIUM}: make install installs Debian's chromium where apt-get can")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: make install installs the dev extras")
    with sync_playwright() as playwright:
        # Playwright gives each launch a fresh, temporary user-data-dir of its own.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium: Browser) -> Iterator[Page]:
    """A tab in a context of its own: no session storage, cookies or cache from other tests."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(20_000)
    yield tab
    context.close()


class Screenshots:
    """Saves pictures of pages under the test's output, and for the docs when asked to."""

    def __init__(self, out: Path) -> None:
        self.out = out
        wanted = os.environ.get(SCREENSHOTS_ENV)
        self.readme = REPO / wanted if wanted else None

    def take(self, page: Page, name: str) -> Path:
        path = self.out / f"{name}.png"
        page.screenshot(path=str(path))
        if self.readme is not None:
            self.readme.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, self.readme / path.name)
        return path


@pytest.fixture
def screenshots(tmp_path: Path) -> Screenshots:
    return Screenshots(tmp_path)
