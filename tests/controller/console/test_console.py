"""The web console in a real headless Chromium, against a real hostd and a real controller process.

What a person does: open ``/console/``, paste the admin token, click through to the ``dev``
instance, start a session and type into it; resize the window; live through a controller that is
killed and started again; end the shell. Then the other side: a second tab that may only watch, and
another instance's token, which sees nothing of ``dev``. Every page is checked for Content-Security-
Policy violations and uncaught errors, and the terminal page is saved as a screenshot.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import signal
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ...pki import Pki
from ..a2a.helpers import A2A_HEADERS
from ..conftest import ADMIN_TOKEN, ROOT, ControllerProcess, LiveHostd, controller_env
from .browser import Browser, BrowserUnavailable, start_browser

#: Where the test leaves what a person may want to look at (kept after a passing run, unlike tmp dirs).
ARTIFACTS = Path(os.environ.get("AIWG_TEST_ARTIFACTS") or ROOT / ".test-artifacts")
COUNT = 40
COUNTER = f"for i in $(seq 1 {COUNT}); do echo line-$i; sleep 0.1; done\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """``agentic-controller --dev`` (what ``make run`` starts) on a fixed port, killable and
    restartable on the same port and state, as a person's browser would see it."""

    def __init__(
        self, hostd: LiveHostd, state_dir: Path, nursery: trio.Nursery, *, ca: Path | None = None, **env: str
    ) -> None:
        self.env = controller_env(state_dir, hostd.socket_path, AIWG_LISTEN=f"127.0.0.1:{_free_port()}", **env)
        self.nursery = nursery
        self.verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca)) if ca else True
        self.proc: ControllerProcess | None = None
        self.url = ""

    async def start(self) -> None:
        self.proc = ControllerProcess(self.env, dev=True)
        self.url = await self.proc.start(self.nursery)
        async with self.admin() as admin:
            with trio.fail_after(30):
                while (await admin.get("/readyz")).status_code != 200:
                    await trio.sleep(0.05)

    async def kill(self) -> None:
        assert self.proc is not None
        assert await self.proc.stop(signal.SIGKILL) == -signal.SIGKILL

    async def stop(self) -> None:
        if self.proc is not None:
            await self.proc.stop()

    def admin(self) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=15, verify=self.verify)

    async def dev_instance(self) -> str:
        """The id of ``dev`` once the controller's dev mode has it running."""
        async with self.admin() as admin:
            with trio.fail_after(30):
                while True:
                    items = (await admin.get("/api/v2/admin/instances")).json()["items"]
                    dev = [i for i in items if i["name"] == "dev" and i["state"] == "running"]
                    if dev:
                        return str(dev[0]["id"])
                    await trio.sleep(0.1)


@pytest.fixture
async def served(hostd: LiveHostd, tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Served]:
    live = Served(hostd, tmp_path / "controller", nursery)
    await live.start()
    try:
        yield live
    finally:
        await live.stop()


async def sign_in(browser: Browser, url: str, token: str) -> None:
    await browser.get(f"{url}/console/")
    await browser.type("#token-input", token)
    await browser.click("#signin-submit")


def numbered(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := re.fullmatch(r"line-(\d+)", line.strip()))]


async def no_problems(browser: Browser) -> None:
    problems = await browser.problems()
    assert problems == {"violations": [], "errors": []}, problems


async def open_dev_and_start_a_session(browser: Browser, served: Served, dev_id: str) -> dict[str, Any]:
    await sign_in(browser, served.url, ADMIN_TOKEN)
    await browser.click(f'#instances a[href="#/instances/{dev_id}"]')
    await browser.find("#agent-card")
    assert "full host access" in await browser.text("h1")
    await browser.click("#session-create")
    return await browser.until_terminal(
        lambda t: t["status"] == "live" and t["role"] == "controller", "the session attached, controlling"
    )


@pytest.mark.slow
async def test_a_person_types_into_the_dev_instance_through_a_controller_restart(
    served: Served, browser: Browser
) -> None:
    dev_id = await served.dev_instance()
    await open_dev_and_start_a_session(browser, served, dev_id)

    await browser.keys("echo hi\n")
    await browser.until_terminal(lambda t: "hi" in [line.strip() for line in t["lines"]], "`hi` on the screen")

    # The size follows the window: stty in the session says what the terminal shows.
    before = await browser.terminal()
    await browser.keys("stty size\n")
    await browser.until_terminal(lambda t: f"{before['rows']} {before['cols']}" in t["lines"], "the first stty size")
    await browser.resize(760, 520)
    after = await browser.until_terminal(
        lambda t: (t["cols"], t["rows"]) != (before["cols"], before["rows"]), "the terminal to follow the window"
    )
    assert after["cols"] < before["cols"] and after["rows"] < before["rows"]
    await browser.keys("stty size\n")
    await browser.until_terminal(lambda t: f"{after['rows']} {after['cols']}" in t["lines"], "stty size to change")

    # The controller dies mid-output and comes back: the page reconnects with replay_from and the
    # transcript continues where it was, every line once, in order.
    await browser.keys(COUNTER)
    await browser.until_terminal(lambda t: len(numbered(t["lines"])) >= 5, "the counter to start")
    await served.kill()
    await browser.until_terminal(lambda t: t["status"] != "live", "the page to notice the controller is gone")
    await trio.sleep(0.5)  # the shell goes on writing while no controller is there
    await served.start()
    done = await browser.until_terminal(
        lambda t: t["reconnects"] >= 1 and numbered(t["lines"])[-1:] == [COUNT], "the counter to finish", timeout=40
    )
    assert numbered(done["lines"]) == list(range(1, COUNT + 1)), done["lines"]
    assert "hi" in [line.strip() for line in done["lines"]]  # what came before the drop is still there
    assert done["notice"] is not None and done["notice"].startswith("Reconnected"), done
    assert "Reconnected" in await browser.text("#term-notice")
    await browser.keys("echo back\n")
    await browser.until_terminal(lambda t: "back" in [line.strip() for line in t["lines"]], "typing after the restart")

    await browser.screenshot(ARTIFACTS / "console-terminal.png")
    print(f"terminal page screenshot: {ARTIFACTS / 'console-terminal.png'}")

    await browser.keys("exit 3\n")
    ended = await browser.until_terminal(lambda t: t["exit"] is not None, "the session's end")
    assert ended["exit"]["exit_code"] == 3
    assert "exited with code 3" in await browser.text("#term-exit")

    # Back on the instance page: the session listed as exited with its code, its events in the feed.
    await browser.click(f'#crumbs a[href="#/instances/{dev_id}"]')
    await browser.until(
        lambda: "exit code 3" in browser.driver.find_element("id", "session-list").text, "the exited session listed"
    )
    await browser.until(
        lambda: browser.driver.find_elements("css selector", '#event-list li[data-kind="session.exited"]'),
        "session.exited in the event feed",
    )
    await browser.screenshot(ARTIFACTS / "console-instance.png")
    await no_problems(browser)


@pytest.mark.slow
async def test_a_second_tab_observes_and_cannot_type(served: Served, browser: Browser) -> None:
    dev_id = await served.dev_instance()
    first = await open_dev_and_start_a_session(browser, served, dev_id)
    session_url = await browser.js("return location.href")
    await browser.keys("echo from-the-controller\n")
    await browser.until_terminal(lambda t: "from-the-controller" in t["lines"], "the controller's output")

    first_tab = await browser.tab()
    second_tab = await browser.new_tab()  # sessionStorage is per tab: it signs in on its own
    await sign_in(browser, served.url, ADMIN_TOKEN)
    await browser.find("#instances")
    await browser.get(session_url)  # the same session, asking to control it too: it is downgraded
    watched = await browser.until_terminal(
        lambda t: t["role"] == "observer" and "from-the-controller" in t["lines"],  # the screen, from the keyframe
        "the second tab to observe the screen as it is",
    )
    assert "Joined as an observer" in await browser.text("#term-notice")
    assert (watched["cols"], watched["rows"]) == (first["cols"], first["rows"])  # the controller's size
    await browser.keys("echo from-the-observer\n")
    await trio.sleep(0.5)
    assert "from-the-observer" not in "\n".join((await browser.terminal())["lines"])

    # The first tab leaves the session; the second takes control and its keys go through.
    await browser.switch(first_tab)
    await browser.click(f'#crumbs a[href="#/instances/{dev_id}"]')
    await browser.find("#session-list")
    await browser.switch(second_tab)
    await browser.until_terminal(lambda t: t["role"] == "observer", "still observing")
    await browser.click("#term-control")
    await browser.until_terminal(lambda t: t["role"] == "controller", "control taken")
    await browser.keys("echo now-in-control\n")
    await browser.until_terminal(lambda t: "now-in-control" in t["lines"], "the new controller's keys")

    await browser.get(session_url + "/observe")  # asked for observing outright
    await browser.until_terminal(lambda t: t["role"] == "observer" and t["status"] == "live", "observing")
    assert "observing" in await browser.text("#term-role")
    await no_problems(browser)


@pytest.mark.slow
async def test_another_instances_token_sees_nothing_of_this_one(served: Served, browser: Browser) -> None:
    dev_id = await served.dev_instance()
    async with served.admin() as admin:
        provisioned = await admin.post("/api/v2/admin/instances", json={"name": "neighbour", "runtime": "host"})
        assert provisioned.status_code == 202, provisioned.text
        neighbour_token = provisioned.json()["a2a_token"]
        with trio.fail_after(15):
            while (op := (await admin.get(provisioned.headers["Location"])).json())["state"] != "succeeded":
                assert op["state"] in ("pending", "running"), op
                await trio.sleep(0.05)
        neighbour_id = op["result"]["instance_id"]
        started = await admin.post(f"/api/v2/admin/instances/{neighbour_id}/start")
        assert started.status_code == 202
        created = await admin.post(f"/api/v2/admin/instances/{dev_id}/sessions", json={"argv": ["/bin/cat"]})
        dev_session = created.json()["id"]

    await sign_in(browser, served.url, "not-a-token-of-this-controller")
    await browser.until(
        lambda: "refused this token" in browser.driver.find_element("id", "signin-error").text, "the refusal"
    )
    assert await browser.js("return sessionStorage.length") == 0
    await sign_in(browser, served.url, neighbour_token)
    await browser.until(
        lambda: browser.driver.find_elements("css selector", "#instances a.instance-link"), "its instance list"
    )
    names = await browser.text("#instances")
    assert "neighbour" in names and "dev" not in names.split()

    # dev's pages show exactly what the pages of an instance that does not exist show.
    fake_id, fake_session = "0190a000-0000-7000-8000-000000000000", "0190a000-0000-7000-8000-00000000beef"

    async def shown(route: str, instance_id: str, session_id: str) -> str:
        await browser.get(f"{served.url}/console/{route.format(i=instance_id, s=session_id)}")
        await browser.until(
            lambda: browser.driver.find_elements("css selector", ".error, #term-exit:not([hidden])"), "the refusal"
        )
        await trio.sleep(0.3)  # anything else the page would fetch
        body = await browser.text("body")
        return body.replace(instance_id, "ID").replace(session_id, "SID").replace(session_id[:13], "SID")

    for route in ("#/instances/{i}", "#/instances/{i}/sessions/{s}", "#/instances/{i}/sessions/{s}/observe"):
        seen = await shown(route, dev_id, dev_session)
        assert seen == await shown(route, fake_id, fake_session), route
        assert "/bin/cat" not in seen and "dev" not in seen.split()
    await browser.get(f"{served.url}/console/#/instances/{dev_id}/sessions/{dev_session}")
    refused = await browser.until_terminal(lambda t: t["status"] == "gone", "no attach")
    assert not any(refused["lines"]) and "Cannot attach: no instance" in await browser.text("#term-exit")

    # Its own instance works, event feed aside (operator and admin tokens only): its tasks with their
    # states and artifacts, its sessions, its terminal.
    async with httpx.AsyncClient(
        base_url=f"{served.url}/agents/{neighbour_id}",
        headers={"Authorization": f"Bearer {neighbour_token}", **A2A_HEADERS},
        timeout=15,
    ) as agent:
        message = {"messageId": "m-console-1", "role": "ROLE_USER", "parts": [{"text": "echo task-output-$((6*7))"}]}
        sent = await agent.post("/message:send", json={"message": message, "configuration": {"blocking": True}})
        assert sent.json()["task"]["status"]["state"] == "TASK_STATE_COMPLETED", sent.text
    await browser.get(f"{served.url}/console/#/instances/{neighbour_id}")
    await browser.find("#agent-card")
    await browser.until(
        lambda: "may not read the event feed" in browser.driver.find_element("id", "events").text, "the feed refused"
    )
    tasks = await browser.until(
        lambda: (text := browser.driver.find_element("id", "task-list").text) and "task-output-42" in text and text,
        "the task with its artifact",
    )
    assert "completed" in tasks
    await browser.click("#session-create")
    await browser.until_terminal(lambda t: t["role"] == "controller" and t["status"] == "live", "its own terminal")
    await browser.keys("echo mine\n")
    await browser.until_terminal(lambda t: "mine" in [line.strip() for line in t["lines"]], "its own shell answering")
    assert neighbour_token not in await browser.js("return location.href + document.cookie")
    await no_problems(browser)

    await browser.click("#signout")
    await browser.find("#token-input")
    assert await browser.js("return sessionStorage.length") == 0


@pytest.mark.slow
async def test_a_sleeping_instance_wears_its_badge_and_opening_it_wakes_it(served: Served, browser: Browser) -> None:
    if os.geteuid() != 0:
        pytest.skip("host instances freeze in the cgroup freezer (root)")
    dev_id = await served.dev_instance()
    async with served.admin() as admin:
        slept = await admin.post(f"/api/v2/admin/instances/{dev_id}/sleep")
        assert slept.status_code == 200 and slept.json()["state"] == "sleeping", slept.text
        await sign_in(browser, served.url, ADMIN_TOKEN)
        await browser.until(
            lambda: "sleeping · freeze" in browser.driver.find_element("id", "instances").text, "the badge"
        )
        badge = browser.driver.find_element("css selector", "#instances .state-sleeping")
        assert "operator; traffic wakes it" in (badge.get_attribute("title") or "")
        assert (await admin.get(f"/api/v2/admin/instances/{dev_id}")).json()["state"] == "sleeping"
        await browser.click(f'#instances a[href="#/instances/{dev_id}"]')
        await browser.until(
            lambda: browser.driver.find_element("id", "instance-state").text == "running", "the instance awake"
        )
        body = (await admin.get(f"/api/v2/admin/instances/{dev_id}")).json()
    assert body["state"] == "running" and body["provider_state"]["last_wake"]["cause"] == "operator"
    await no_problems(browser)


def spki_digest(cert: Path) -> str:
    """Base64 SHA-256 of a certificate's public key: what Chromium is told to trust."""
    public = x509.load_pem_x509_certificate(cert.read_bytes()).public_key()
    der = public.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


@pytest.mark.slow
async def test_the_console_over_https_types_through_wss(
    hostd: LiveHostd, tmp_path: Path, nursery: trio.Nursery
) -> None:
    """The console served over TLS: the page, its API calls and its terminal's wss:// socket, with
    Chromium trusting exactly the server's key."""
    server = Pki(tmp_path / "pki").server()
    served = Served(
        hostd,
        tmp_path / "controller",
        nursery,
        ca=tmp_path / "pki" / "ca.pem",
        AIWG_TLS_CERT=str(server.cert),
        AIWG_TLS_KEY=str(server.key),
    )
    await served.start()
    assert served.url.startswith("https://")
    try:
        browser = await start_browser(
            tmp_path / "chromium", (f"--ignore-certificate-errors-spki-list={spki_digest(server.cert)}",)
        )
    except BrowserUnavailable as exc:
        pytest.skip(f"Chromium cannot start here: {exc}")
    try:
        dev_id = await served.dev_instance()
        terminal = await open_dev_and_start_a_session(browser, served, dev_id)
        assert terminal["status"] == "live"
        assert await browser.js("return location.protocol") == "https:"
        await browser.keys("echo over-$((40+2))\n")
        await browser.until_terminal(lambda t: "over-42" in [line.strip() for line in t["lines"]], "the echo over wss")
        await no_problems(browser)
    finally:
        await browser.quit()
        await served.stop()
