"""What happens without the controller reaches the event bus: a main process that exits on hostd,
sessions any client made, and state that changed while the controller was down (reconcile)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from agentic_sandbox.controller.config import load_config
from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd

from ..conftest import LiveController, LiveHostd, controller_env, provision, serve_controller
from ..sse import SseEvent, SseReader

EVENTS = "/api/v2/admin/events"
SLEEPER = 'name: sleeper\nversion: "1"\nruntime: host\ncommand: ["/bin/cat"]\nservice: ["/bin/sleep", "600"]\n'


def _env(hostd: LiveHostd, state: Path) -> dict[str, str]:
    return controller_env(state, hostd.socket_path, AIWG_WATCH_INTERVAL_S="0.1")


@pytest.fixture
async def watched(hostd: LiveHostd, tmp_path: Path) -> AsyncIterator[LiveController]:
    async with serve_controller(load_config(env=_env(hostd, tmp_path / "controller"))) as live:
        yield live


async def _sleeper(client: httpx.AsyncClient, name: str) -> str:
    r = await client.post("/api/v2/admin/loadouts", json={"name": "sleeper", "manifest": SLEEPER})
    assert r.status_code in (201, 409), r.text
    return (await provision(client, name, start=True, loadout="sleeper"))["result"]["instance_id"]


async def _next_for(reader: SseReader, subject: str, kind: str) -> SseEvent:
    with trio.fail_after(15):
        return await reader.until(lambda e: e.event == kind and e.data["subject"] == subject)


async def test_a_main_process_that_exits_on_hostd_is_an_event(watched: LiveController, hostd: LiveHostd) -> None:
    async with watched.client() as admin:
        iid = await _sleeper(admin, "exiter")
        info = next(i for i in await hostd.instances() if i.instance_id == iid)
        assert info.host is not None and info.host.pid is not None
        async with admin.stream("GET", EVENTS, params={"follow": "true", "kind": "instance.*"}) as response:
            reader = SseReader(response)
            os.kill(info.host.pid, signal.SIGKILL)  # behind the controller's back
            event = await _next_for(reader, f"instance/{iid}", "instance.state_changed")
    data = event.data["data"]
    assert (data["from"], data["cause"]) == ("running", "reconcile")
    assert data["to"] != "running" and "operation_id" not in data


async def test_sessions_made_by_any_client_are_events(watched: LiveController, hostd: LiveHostd) -> None:
    async with watched.client() as admin:
        iid = (await provision(admin, "sessions", start=True))["result"]["instance_id"]
        async with admin.stream("GET", EVENTS, params={"follow": "true", "kind": "session.*"}) as response:
            reader = SseReader(response)
            with trio.fail_after(15):
                while watched.state.watch.polls < 2:  # the baseline is taken: what follows is new
                    await trio.sleep(0.05)
            async with open_hostd(hostd.socket_path, client_name="test") as client:
                long = (await client.call(m.SessionCreateRequest(instance_id=iid, argv=["/bin/sleep", "600"]))).session
                brief = (await client.call(m.SessionCreateRequest(instance_id=iid, argv=["/bin/true"]))).session
                created = await _next_for(reader, f"session/{long.session_id}", "session.created")
                assert created.data["data"] == {"instance_id": iid}
                # One that came and went between two polls is announced both ways.
                await _next_for(reader, f"session/{brief.session_id}", "session.created")
                done = await _next_for(reader, f"session/{brief.session_id}", "session.exited")
                assert done.data["data"]["exit_code"] == 0
                await client.call(m.SessionKillRequest(session_id=long.session_id, grace_s=0))
                killed = await _next_for(reader, f"session/{long.session_id}", "session.exited")
                assert killed.data["data"]["instance_id"] == iid and killed.data["data"]["end_reason"] is not None


async def test_a_change_while_the_controller_was_down_is_reconciled_into_an_event(
    hostd: LiveHostd, tmp_path: Path
) -> None:
    state = tmp_path / "controller"
    async with serve_controller(load_config(env=_env(hostd, state))) as first, first.client() as admin:
        iid = await _sleeper(admin, "offline")
    async with open_hostd(hostd.socket_path, client_name="test") as client:
        await client.call(m.InstanceStopRequest(instance_id=iid, grace_s=0))
    async with serve_controller(load_config(env=_env(hostd, state))) as second, second.client() as admin:
        with trio.fail_after(15):  # the reconcile runs once the link is up, after wait_ready returns
            while True:
                items = (await admin.get(EVENTS, params={"kind": "instance.state_changed"})).json()["items"]
                changes = [
                    (e["data"]["from"], e["data"]["to"], e["data"]["cause"])
                    for e in items
                    if e["subject"] == f"instance/{iid}"
                ]
                if changes:
                    break
                await trio.sleep(0.05)
    assert changes == [("running", "stopped", "reconcile")]
