"""``agentic attach|sessions|session new`` the way a person uses them: inside a real tmux, keys typed
with ``send-keys``, the screen read with ``capture-pane``; a real hostd and controller behind."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from tests.controller.conftest import (  # noqa: F401  (fixtures)
    ADMIN_TOKEN,
    ControllerProcess,
    LiveController,
    LiveHostd,
    admin,
    controller,
    controller_env,
    hostd,
    provision,
    short_dir,
)
from tests.hostd_process import ROOT

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

AGENTIC = [sys.executable, "-m", "agentic_sandbox.cli.agentic"]
SHELL = {"argv": ["/bin/bash", "--norc", "--noprofile", "-i"], "env": {"PS1": "$ "}}


class Tmux:
    def __init__(self, sock: Path) -> None:
        self.sock = str(sock)

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.sock, *args], check=True, capture_output=True, text=True).stdout

    def start(self, name: str, command: list[str], env: dict[str, str]) -> None:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        line = f'cd {shlex.quote(str(ROOT))} && env {exports} {shlex.join(command)}; echo "[exit $?]"; sleep 600'
        self.run("new-session", "-d", "-s", name, "-x", "100", "-y", "30", line)

    def keys(self, name: str, *keys: str) -> None:
        self.run("send-keys", "-t", name, *keys)

    def screen(self, name: str) -> str:
        return self.run("capture-pane", "-p", "-t", name)

    async def wait_for(self, name: str, text: str, count: int = 1, timeout: float = 20) -> str:
        with trio.move_on_after(timeout):
            while True:
                screen = self.screen(name)
                if screen.count(text) >= count:
                    return screen
                await trio.sleep(0.05)
        others = "\n".join(f"--- {w}:\n{self.screen(w)}" for w in self.run("list-sessions", "-F", "#S").split())
        raise AssertionError(f"{text!r} not on the screen of {name}:\n{others}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-S", self.sock, "kill-server"], capture_output=True)


@pytest.fixture
def tmux(short_dir: Path) -> Iterator[Tmux]:  # noqa: F811
    mux = Tmux(short_dir / "tmux.sock")
    try:
        yield mux
    finally:
        mux.kill()


def agentic_env(url: str) -> dict[str, str]:
    return {"AIWG_CONTROLLER_URL": url, "AIWG_TOKEN": ADMIN_TOKEN, "PYTHONPATH": str(ROOT), "TERM": "xterm"}


async def run_agentic(url: str, *args: str) -> str:
    env = {**os.environ, **agentic_env(url)}
    result = await trio.run_process([*AGENTIC, *args], env=env, cwd=ROOT, capture_stdout=True, capture_stderr=True)
    return result.stdout.decode()


async def test_attach_type_resize_detach(controller: LiveController, admin: httpx.AsyncClient, tmux: Tmux) -> None:  # noqa: F811
    await provision(admin, "term", start=True)
    sid = (await run_agentic(controller.url, "session", "new", "term", "--env", "PS1=$ ", "--", *SHELL["argv"])).strip()
    listing = await run_agentic(controller.url, "sessions", "term")
    assert sid in listing and "running" in listing

    tmux.start("t", [*AGENTIC, "attach", "term", sid], agentic_env(controller.url))
    await tmux.wait_for("t", "$")
    tmux.keys("t", "echo hello-$((6*7))", "Enter")
    await tmux.wait_for("t", "hello-42")

    iid = (await admin.get("/api/v2/admin/instances")).json()["items"][0]["id"]
    info_url = f"/api/v2/admin/instances/{iid}/sessions/{sid}"
    with trio.fail_after(20):  # the session took this terminal's size at join...
        while ((info := (await admin.get(info_url)).json())["cols"], info["rows"]) != (100, 30):
            await trio.sleep(0.05)
    tmux.run("resize-window", "-t", "t", "-x", "81", "-y", "21")
    with trio.fail_after(20):  # ...and follows it
        while ((info := (await admin.get(info_url)).json())["cols"], info["rows"]) != (81, 21):
            await trio.sleep(0.05)
    tmux.keys("t", "stty size", "Enter")
    await tmux.wait_for("t", "21 81")

    tmux.keys("t", "C-]")
    screen = await tmux.wait_for("t", "[exit 0]")
    assert f"[detached from {sid}" in screen
    assert (await admin.get(info_url)).json()["state"] == "running"  # detach leaves the shell

    # Attach again: the keyframe paints the screen as it is. (The new tmux session starts before the
    # old one is killed: killing the last session stops the tmux server, and a new-session racing
    # that exit fails.)
    tmux.start("u", [*AGENTIC, "attach", iid, sid], agentic_env(controller.url))
    tmux.run("kill-session", "-t", "t")
    await tmux.wait_for("u", "hello-42")
    tmux.keys("u", "exit 7", "Enter")
    screen = await tmux.wait_for("u", "[exit 7]")
    assert "exit code 7" in screen


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_reconnects_across_a_controller_restart_and_observes(
    hostd: LiveHostd,  # noqa: F811
    tmp_path: Path,
    tmux: Tmux,
) -> None:
    port = free_port()
    env = controller_env(tmp_path / "c", hostd.socket_path, AIWG_LISTEN=f"127.0.0.1:{port}")
    async with trio.open_nursery() as nursery:
        proc = ControllerProcess(env)
        url = await proc.start(nursery)
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
            with trio.fail_after(20):
                while (await client.get("/readyz")).status_code != 200:
                    await trio.sleep(0.05)
            iid = (await provision(client, "restarts", start=True))["result"]["instance_id"]
            created = await client.post(f"/api/v2/admin/instances/{iid}/sessions", json=SHELL)
            sid = created.json()["id"]

        tmux.start("c", [*AGENTIC, "attach", iid, sid], agentic_env(url))
        tmux.start("o", [*AGENTIC, "attach", "--observe", iid, sid], agentic_env(url))
        await tmux.wait_for("c", "$")
        await tmux.wait_for("o", "$")  # both attached (the observer painted its keyframe)
        # Keys typed while the controller client is still starting up have been seen to go missing
        # (about 1 run in 6 on a loaded machine; not understood yet): type a probe until it echoes.
        for attempt in range(10):
            tmux.keys("c", f"echo pro''be-{attempt}", "Enter")
            try:
                await tmux.wait_for("c", f"probe-{attempt}", timeout=2)
                break
            except AssertionError:
                continue
        tmux.keys("c", "sleep 2; echo dur''ing-outage", "Enter")
        await tmux.wait_for("c", "echo dur''ing-outage")  # the shell has the command
        assert await proc.stop(signal.SIGKILL) == -signal.SIGKILL
        await tmux.wait_for("c", "connection lost")
        proc = ControllerProcess(env)
        await proc.start(nursery)
        # The output written while no controller ran arrives once, on both clients.
        await tmux.wait_for("c", "during-outage")
        await tmux.wait_for("o", "during-outage")
        tmux.keys("c", "echo af''ter", "Enter")
        await tmux.wait_for("c", "after")
        await tmux.wait_for("o", "after")
        assert tmux.screen("c").count("during-outage") == 1
        # The observer's keys go nowhere.
        tmux.keys("o", "echo obs''erver-typed", "Enter")
        tmux.keys("c", "echo mar''ker", "Enter")
        await tmux.wait_for("o", "marker")
        assert "observer-typed" not in tmux.screen("c")
        tmux.keys("o", "C-b", "d")
        await tmux.wait_for("o", "[exit 0]")
        tmux.keys("c", "C-]")
        await tmux.wait_for("c", "[exit 0]")
        await proc.stop()
        nursery.cancel_scope.cancel()


async def test_a_pending_session_starts_with_the_attach_argv(
    controller: LiveController,  # noqa: F811
    admin: httpx.AsyncClient,  # noqa: F811
    tmux: Tmux,
) -> None:
    await provision(admin, "later", start=True)
    sid = (await run_agentic(controller.url, "session", "new", "later", "--pending", "--env", "PS1=$ ")).strip()
    assert f"{sid}  pending" in await run_agentic(controller.url, "sessions", "later")

    tmux.start("p", [*AGENTIC, "attach", "later", sid, "--", *SHELL["argv"]], agentic_env(controller.url))
    await tmux.wait_for("p", "$")
    tmux.keys("p", "echo started-$((6*7)) $0", "Enter")
    await tmux.wait_for("p", "started-42 /bin/bash")
    listing = await run_agentic(controller.url, "sessions", "later")
    assert f"{sid}  running" in listing and "--noprofile" in listing
    tmux.keys("p", "C-]")
    await tmux.wait_for("p", "[exit 0]")

    # A start the server refuses ends the attach with its reason; the session still waits.
    bad = (await run_agentic(controller.url, "session", "new", "later", "--pending")).strip()
    tmux.start("q", [*AGENTIC, "attach", "later", bad, "--", "/no/such/program"], agentic_env(controller.url))
    tmux.run("kill-session", "-t", "p")
    screen = await tmux.wait_for("q", "[exit 1]")
    assert "cannot start the session" in screen and "/no/such/program" in screen
    assert f"{bad}  pending" in await run_agentic(controller.url, "sessions", "later")
