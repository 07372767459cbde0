"""Posted writes: keys go to hostd without waiting for the answer, at most MAX_POSTED_WRITES
unanswered, and a failed write is a PTY_WRITE_FAILED frame for the client."""

from __future__ import annotations

import trio
import trio.testing

from agentic_sandbox.controller.errors import InvalidState, Unavailable
from agentic_sandbox.controller.pty.lanes import Outbox
from agentic_sandbox.controller.pty.writes import MAX_POSTED_WRITES, PostedWrites
from agentic_sandbox.proto import messages as m

from .fakes import SID, FakeLink, drain, frames


async def test_writes_are_posted_and_bounded() -> None:
    link, box = FakeLink(), Outbox()
    writes = PostedWrites(link, SID, box)  # type: ignore[arg-type]
    for i in range(MAX_POSTED_WRITES):
        await writes.post(b"%d" % i)
    assert writes.unanswered == MAX_POSTED_WRITES
    assert [post.request for post in link.posts][:2] == [
        m.SessionWriteRequest(session_id=SID, data=b"0"),
        m.SessionWriteRequest(session_id=SID, data=b"1"),
    ]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writes.post, b"more")
        await trio.testing.wait_all_tasks_blocked()
        assert len(link.posts) == MAX_POSTED_WRITES  # waits for an answer
        on_success = link.posts[0].on_success
        assert on_success is not None
        on_success()
    assert len(link.posts) == MAX_POSTED_WRITES + 1
    assert writes.unanswered == MAX_POSTED_WRITES
    assert drain(box) == []


async def test_failed_writes_are_told() -> None:
    link, box = FakeLink(), Outbox()
    writes = PostedWrites(link, SID, box)  # type: ignore[arg-type]
    await writes.post(b"a")
    await writes.post(b"b")
    link.posts[0].on_error(InvalidState("session.exited", "it exited"))
    link.posts[1].on_error(Unavailable("internal.unavailable", "hostd went away"))
    assert writes.unanswered == 0
    link.post_error = Unavailable("internal.unavailable", "hostd is not connected")
    await writes.post(b"c")
    assert writes.unanswered == 0
    told = [(frame["payload"]["code"], frame["payload"]["message"]) for frame in frames(drain(box))]
    assert told == [
        ("PTY_WRITE_FAILED", "the session has exited: it exited"),
        ("PTY_WRITE_FAILED", "hostd went away"),
        ("PTY_WRITE_FAILED", "hostd is not connected"),
    ]
