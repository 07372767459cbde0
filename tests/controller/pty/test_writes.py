"""Posted writes (pty.writes) on a real hostd session through the live controller's link: keys reach
the shell without waiting for their answers, never more than MAX_POSTED_WRITES unanswered, and a
write that fails reaches the client as a PTY_WRITE_FAILED frame."""

from __future__ import annotations

import json
from typing import Any

import trio

from agentic_sandbox.controller.pty.lanes import Outbox
from agentic_sandbox.controller.pty.writes import MAX_POSTED_WRITES, PostedWrites
from agentic_sandbox.proto import messages as m

from ..conftest import LiveHostd
from .conftest import Instance


def told(box: Outbox) -> list[tuple[str, str]]:
    """The error frames queued for the client, taken out without waiting."""
    frames: list[dict[str, Any]] = []
    while not box.empty():
        item = box._control.popleft() if box._control else box._output.popleft()
        if isinstance(item, str):
            frames.append(json.loads(item))
    return [(f["payload"]["code"], f["payload"]["message"]) for f in frames if f["op"] == "pty.session_frame"]


async def output_until(instance: Instance, sid: str, wanted: bytes) -> bytes:
    seen = b""
    async for event in instance.controller.state.link.session_output(sid, 1):
        if isinstance(event, m.SessionOutput):
            seen += event.data
            if wanted in seen:
                return seen
    raise AssertionError(f"the session ended before {wanted!r}: {seen!r}")


async def test_keys_reach_the_shell_with_never_more_than_the_bound_unanswered(instance: Instance) -> None:
    sid = await instance.session(["/bin/cat"])
    box = Outbox()
    writes = PostedWrites(instance.controller.state.link, sid, box)
    most = 0
    for i in range(200):
        await writes.post(b"k%03d\n" % i)
        most = max(most, writes.unanswered)
    assert 0 < most <= MAX_POSTED_WRITES
    with trio.fail_after(10):
        seen = await output_until(instance, sid, b"k199")
        while writes.unanswered:
            await trio.sleep(0.01)
    assert seen.index(b"k000") < seen.index(b"k100") < seen.index(b"k199")  # in order
    assert told(box) == []


async def test_a_write_to_an_exited_session_says_so(instance: Instance) -> None:
    sid = await instance.session(["/bin/true"])
    with trio.fail_after(10):
        while (await instance.admin.get(f"/api/v2/admin/instances/{instance.id}/sessions/{sid}")).json()[
            "state"
        ] == "running":
            await trio.sleep(0.02)
    box = Outbox()
    writes = PostedWrites(instance.controller.state.link, sid, box)
    await writes.post(b"too late\n")
    with trio.fail_after(10):
        while writes.unanswered:
            await trio.sleep(0.01)
    [(code, message)] = told(box)
    assert code == "PTY_WRITE_FAILED" and message.startswith("the session has exited: ")


async def test_a_write_without_hostd_fails_at_once(instance: Instance, hostd: LiveHostd) -> None:
    sid = await instance.session(["/bin/cat"])
    link = instance.controller.state.link
    await hostd.stop()
    with trio.fail_after(10):
        while link.ready:
            await trio.sleep(0.02)
    box = Outbox()
    writes = PostedWrites(link, sid, box)
    await writes.post(b"x")
    assert writes.unanswered == 0
    [(code, message)] = told(box)
    assert code == "PTY_WRITE_FAILED" and "hostd" in message
