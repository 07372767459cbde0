"""Fixtures of the web console tests: the console built from its sources, and a real headless
Chromium (Debian's ``chromium`` driven by Debian's ``chromedriver`` through Selenium).

* ``console_build`` (session, autouse): runs ``scripts/build-console.py`` once, so the tests serve
  what ``console/src/`` holds now (``make test`` has built it already; the script is then a copy).
* ``browser``: a fresh Chromium with its own profile; skipped, with the reason, only where Chromium
  cannot start. Its pages record every Content-Security-Policy violation and uncaught error.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.hostd_process import ROOT

from .browser import Browser, BrowserUnavailable, start_browser


@pytest.fixture(scope="session", autouse=True)
def console_build() -> Iterator[Path]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build-console.py")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    yield ROOT / "src" / "agentic_sandbox" / "controller" / "console" / "build"


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    try:
        live = await start_browser(tmp_path / "chromium")
    except BrowserUnavailable as exc:
        pytest.skip(f"Chromium cannot start here: {exc}")
    try:
        yield live
    finally:
        await live.quit()
