"""A real headless Chromium for the console tests, driven from trio.

Debian's ``chromium`` and ``chromedriver`` (the same release, so the driver always speaks the
browser's protocol) through Selenium. Selenium's calls block: each runs in a worker thread, one at a
time. The flags are the ones that work as root on a machine without network: no sandbox, no GPU,
and no background networking (else Chromium's own connections are refused and it stalls).

Every page gets a probe before its own scripts run: it records Content-Security-Policy violations
and uncaught errors in ``window.__probe``, which :meth:`Browser.problems` reads.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import trio
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1100,800",
]
PROBE = """
window.__probe = {violations: [], errors: []};
document.addEventListener('securitypolicyviolation', (e) => {
  window.__probe.violations.push(`${e.effectiveDirective} blocked ${e.blockedURI} ${e.sample || ''}`);
});
window.addEventListener('error', (e) => window.__probe.errors.push(String(e.message)));
window.addEventListener('unhandledrejection', (e) => window.__probe.errors.push(String(e.reason)));
"""
T = TypeVar("T")


class BrowserUnavailable(Exception):
    pass


class Browser:
    def __init__(self, driver: webdriver.Chrome) -> None:
        self.driver = driver
        self._lock = trio.Lock()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        async with self._lock:  # the driver takes one command at a time
            return await trio.to_thread.run_sync(partial(fn, *args))

    async def get(self, url: str) -> None:
        await self.call(self.driver.get, url)

    async def js(self, script: str, *args: Any) -> Any:
        return await self.call(self.driver.execute_script, script, *args)

    async def find(self, css: str, timeout: float = 15) -> WebElement:
        """The first element matching ``css`` once there is one."""

        def first() -> WebElement | None:
            found = self.driver.find_elements(By.CSS_SELECTOR, css)
            return found[0] if found else None

        return await self.until(first, f"an element {css!r}", timeout)

    async def until(self, probe: Callable[[], T | None], what: str, timeout: float = 15) -> T:
        """Polls ``probe`` (in the worker thread) until it answers something truthy; an element it
        looks for that is not there (yet) counts as a falsy answer."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = await self.call(probe)
            except (NoSuchElementException, StaleElementReferenceException):
                value = None  # not on the page (yet, or any more): the page is still changing
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {timeout} s for {what}; the page shows:\n{await self.text('body')}")
            await trio.sleep(0.1)

    async def text(self, css: str) -> str:
        def read() -> str:
            found = self.driver.find_elements(By.CSS_SELECTOR, css)
            return found[0].text if found else ""

        return await self.call(read)

    async def click(self, css: str, timeout: float = 15) -> None:
        """Clicks the first element matching ``css``, finding it again if the page replaced it."""

        def click() -> bool:
            found = self.driver.find_elements(By.CSS_SELECTOR, css)
            if not found:
                return False
            found[0].click()
            return True

        await self.until(click, f"an element {css!r} to click", timeout)

    async def type(self, css: str, text: str) -> None:
        element = await self.find(css)
        await self.call(element.send_keys, text)

    async def replace_value(self, css: str, text: str) -> None:
        element = await self.find(css)
        await self.call(element.clear)
        await self.call(element.send_keys, text)

    async def terminal(self) -> dict[str, Any]:
        """What the console's read-only hook says of the terminal page (its screen, size, state)."""
        snapshot = await self.js("return window.aiwgConsole && window.aiwgConsole.terminal()")
        assert snapshot is not None, "no terminal on the page"
        return dict(snapshot)

    async def until_terminal(
        self, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = 20
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            snapshot = self.driver.execute_script("return window.aiwgConsole && window.aiwgConsole.terminal()")
            return snapshot if snapshot is not None and check(snapshot) else None

        try:
            return await self.until(probe, what, timeout)
        except AssertionError:
            lines = [line for line in (await self.terminal())["lines"] if line]
            raise AssertionError(f"waited {timeout} s for {what}; the terminal shows:\n" + "\n".join(lines)) from None

    async def keys(self, text: str) -> None:
        """Types into the terminal as a person does (xterm.js reads keys from its helper textarea)."""
        await self.type(".xterm-helper-textarea", text)

    async def problems(self) -> dict[str, list[str]]:
        return dict(await self.js("return window.__probe"))

    async def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        assert await self.call(self.driver.save_screenshot, str(path)), path

    async def resize(self, width: int, height: int) -> None:
        await self.call(self.driver.set_window_size, width, height)

    async def new_tab(self) -> str:
        """Opens a tab (with the probe: it is installed per tab) and switches to it."""
        await self.call(self.driver.switch_to.new_window, "tab")
        await self.call(self.driver.execute_cdp_cmd, "Page.addScriptToEvaluateOnNewDocument", {"source": PROBE})
        return str(self.driver.current_window_handle)

    async def tab(self) -> str:
        return str(await self.call(lambda: self.driver.current_window_handle))

    async def switch(self, handle: str) -> None:
        await self.call(self.driver.switch_to.window, handle)

    async def quit(self) -> None:
        await trio.to_thread.run_sync(self.driver.quit)


def _start(profile: Path, flags: tuple[str, ...] = ()) -> webdriver.Chrome:
    if shutil.which(CHROMIUM) is None or shutil.which(CHROMEDRIVER) is None:
        raise BrowserUnavailable(f"{CHROMIUM} or {CHROMEDRIVER} is missing (Debian: chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, *flags, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except WebDriverException as exc:
        raise BrowserUnavailable(exc.msg or str(exc)) from None
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": PROBE})
    return driver


async def start_browser(profile: Path, flags: tuple[str, ...] = ()) -> Browser:
    return Browser(await trio.to_thread.run_sync(_start, profile, flags))
