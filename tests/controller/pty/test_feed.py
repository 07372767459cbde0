"""The replay feed in memory: replay from a sequence then a keyframe, live output sent directly,
lags told, and the ends (the session's exit, its deletion, hostd lost) as the binding says."""

from __future__ import annotations

from typing import Any

from agentic_sandbox.controller.errors import OutcomeUnknown
from agentic_sandbox.controller.pty import frames as f
from agentic_sandbox.controller.pty.feed import ReplayFeed
from agentic_sandbox.controller.pty.lanes import Outbox
from agentic_sandbox.controller.pty.rooms import Room
from agentic_sandbox.proto import messages as m

from .fakes import SID, FakeLink, closes, drain, frames, session_info


def feed(link: FakeLink, *, replay_from: int | None = None) -> tuple[ReplayFeed, Outbox, list[str | bytes]]:
    box, sent = Outbox(), []

    async def send(item: str | bytes) -> None:
        sent.append(item)

    return ReplayFeed(link, SID, box, send, binary=True, replay_from=replay_from), box, sent  # type: ignore[arg-type]


def kinds(items: list[Any]) -> list[str]:
    return [frame["payload"].get("kind") or frame["op"] for frame in frames(items)]


async def test_replay_then_a_keyframe_then_the_exit() -> None:
    link = FakeLink(session_info(first_seq=1, next_seq=4))
    link.events = [
        m.SessionOutput(seq=2, data=b"two"),
        m.SessionOutput(seq=3, data=b"three"),
        m.SessionOutput(seq=4, data=b"four"),
        m.SessionExited(exit_code=0, signal=None, reason="exited", last_seq=4),
    ]
    room = Room(SID, 80, 24)
    replay, box, sent = feed(link, replay_from=9)  # the join's replay_from wins over the upgrade's
    await replay.run(room, 1)
    assert link.subscribed == [2]
    assert sent == [f.output_binary(seq, data) for seq, data in ((2, b"two"), (3, b"three"), (4, b"four"))]
    items = drain(box)
    assert kinds(items) == ["Keyframe", "Closed", "binding_goodbye"]  # the keyframe once the replay is current
    assert closes(items) == [f.CLOSE_NORMAL]
    assert room.screen.anchor == 0  # it lacks seq 1, which is the room's own catch-up to read back


async def test_a_replay_out_of_range_is_an_error_then_a_keyframe() -> None:
    link = FakeLink(session_info(first_seq=5, next_seq=9))
    replay, box, sent = feed(link, replay_from=1)
    await replay.run(Room(SID, 80, 24), None)
    items = drain(box)
    (error, keyframe, closed, _goodbye) = frames(items)
    assert error["op"] == "Error" and error["payload"]["code"] == "REPLAY_OUT_OF_RANGE"
    assert error["payload"]["message"] == "replay_from=1 is outside 4..8"
    assert keyframe["payload"]["kind"] == "Keyframe"
    assert closed["payload"] == {"kind": "Closed", "reason": "killed", "detail": "session deleted"}
    assert link.subscribed == [5] and sent == []


async def test_a_lag_is_told_with_a_keyframe() -> None:
    link = FakeLink(session_info(next_seq=3))
    link.events = [m.SessionLagged(missed_from=3, resume_seq=7), m.SessionOutput(seq=7, data=b"x")]
    replay, box, sent = feed(link)
    await replay.run(Room(SID, 80, 24), 2)
    _keyframe, lagged, *_rest = frames(items := drain(box))  # nothing to replay: a keyframe at once
    assert lagged["payload"] == {
        "kind": "Error",
        "code": "PTY_OUTPUT_LAGGED",
        "message": "output 3..6 was dropped unsent",
    }
    assert kinds(items)[:3] == ["Keyframe", "Error", "Keyframe"]
    assert sent == [f.output_binary(7, b"x")]


async def test_losing_hostd_is_a_goodbye_and_1011() -> None:
    link = FakeLink(session_info(next_seq=1))
    link.events = [OutcomeUnknown("internal.unavailable", "hostd is unavailable: connection lost")]
    replay, box, _sent = feed(link)
    await replay.run(Room(SID, 80, 24), None)
    items = drain(box)
    goodbye = frames(items)[-1]
    assert goodbye["op"] == "binding_goodbye" and goodbye["payload"]["reason"] == "other"
    assert closes(items) == [f.CLOSE_SERVER_ERROR]
