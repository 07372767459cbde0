"""The heartbeat: pings on a clock, pongs with the ping's id, and an idle timer every frame
restarts (trio's autojump clock: no real waiting)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from agentic_sandbox.controller.pty import frames as f
from agentic_sandbox.controller.pty.heartbeat import Heartbeat
from agentic_sandbox.controller.pty.lanes import Outbox

SID = "s-1"


def frames(box: Outbox) -> list[dict[str, Any]]:
    """The JSON frames queued in ``box`` (both lanes, control first), taken out without waiting."""
    taken = []
    while not box.empty():
        taken.append(box._control.popleft() if box._control else box._output.popleft())
    return [json.loads(item) for item in taken if isinstance(item, str)]


async def test_a_silent_client_is_pinged_then_reaped(autojump_clock: trio.abc.Clock) -> None:
    box = Outbox()
    beat = Heartbeat(box, SID, interval_s=1.0, timeout_s=3.5)
    began = trio.current_time()
    await beat.run()
    assert trio.current_time() - began == pytest.approx(3.5)
    assert [frame["op"] for frame in frames(box)] == ["ping", "ping", "ping"]


async def test_every_frame_restarts_the_idle_timer(autojump_clock: trio.abc.Clock) -> None:
    box = Outbox()
    beat = Heartbeat(box, SID, interval_s=1.0, timeout_s=3.0)
    reaped_at: list[float] = []

    async def run(*, task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED) -> None:
        await beat.run(task_status=task_status)
        reaped_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        scope = await nursery.start(run)
        assert isinstance(scope, trio.CancelScope)
        for _ in range(10):
            await trio.sleep(2.5)
            beat.seen()
        assert not reaped_at  # 25 s, never 3 s silent
        last = trio.current_time()
    assert reaped_at == [pytest.approx(last + 3.0)]
    assert len(frames(box)) == 27  # a ping a second all along


async def test_the_scope_handed_back_stops_it(autojump_clock: trio.abc.Clock) -> None:
    box = Outbox()
    beat = Heartbeat(box, SID, interval_s=1.0, timeout_s=3.0)
    async with trio.open_nursery() as nursery:
        scope = await nursery.start(beat.run)
        await trio.sleep(1.5)
        scope.cancel()
    await trio.sleep(10)
    assert len(frames(box)) == 1


async def test_a_ping_is_answered_with_its_id() -> None:
    box = Outbox()
    Heartbeat(box, SID, interval_s=1.0, timeout_s=3.0).pong(f.Ping(client_ts="2026-01-01T00:00:00Z"), "rid")
    (pong,) = frames(box)
    assert pong["op"] == "pong" and pong["id"] == "rid"
    assert pong["payload"]["client_ts"] == "2026-01-01T00:00:00Z" and pong["payload"]["server_ts"]
