"""The replay feed (pty.feed) on real hostd sessions through the live controller's link and a real
room: a replay then the session's end, a replay_from outside what hostd holds answered with an
error and a keyframe, hostd lost mid-stream ending with goodbye and 1011."""

from __future__ import annotations

import base64
import json
from typing import Any

import trio

from agentic_sandbox.controller.pty import frames as f
from agentic_sandbox.controller.pty.feed import ReplayFeed
from agentic_sandbox.controller.pty.lanes import Close, Outbox
from agentic_sandbox.controller.pty.rooms import Room

from ..conftest import LiveHostd
from .conftest import Instance


class Client:
    """What the socket would have sent: output through ``send``, the rest through the outbox."""

    def __init__(self) -> None:
        self.box = Outbox()
        self.sent: list[dict[str, Any]] = []

    async def send(self, item: str | bytes) -> None:
        assert isinstance(item, str)
        self.sent.append(json.loads(item))

    def output(self) -> bytes:
        return b"".join(base64.b64decode(frame["payload"]["data"]) for frame in self.sent)

    def queued(self) -> list[Any]:
        """The output lane's frames (JSON decoded) and closes, in order."""
        items = []
        while not self.box.empty():
            item = self.box._control.popleft() if self.box._control else self.box._output.popleft()
            items.append(item if isinstance(item, Close) else json.loads(item))
        return items


async def exited(instance: Instance, argv: list[str]) -> str:
    sid = await instance.session(argv)
    with trio.fail_after(10):
        url = f"/api/v2/admin/instances/{instance.id}/sessions/{sid}"
        while (await instance.admin.get(url)).json()["state"] == "running":
            await trio.sleep(0.02)
    return sid


def kinds(items: list[Any]) -> list[str]:
    return [
        f"close {item.code}" if isinstance(item, Close) else item["payload"].get("kind", item["op"]) for item in items
    ]


async def test_a_replay_then_the_sessions_end(instance: Instance) -> None:
    sid = await exited(instance, ["/bin/sh", "-c", "printf 'one\\ntwo\\n'; exit 3"])
    client = Client()
    feed = ReplayFeed(instance.controller.state.link, sid, client.box, client.send, binary=False)
    with trio.fail_after(10):
        await feed.run(Room(sid, 80, 24), 0)
    assert b"one\r\ntwo\r\n" in client.output()  # the terminal turns LF into CR LF
    queued = client.queued()
    assert kinds(queued)[-3:] == ["Closed", "binding_goodbye", f"close {f.CLOSE_NORMAL}"]
    closed = queued[-3]["payload"]
    assert (closed["reason"], closed["exit_code"]) == ("normal", 3)


async def test_a_replay_from_outside_what_hostd_holds_is_an_error_then_a_keyframe(instance: Instance) -> None:
    sid = await exited(instance, ["/bin/sh", "-c", "printf 'shown\\n'"])
    client = Client()
    feed = ReplayFeed(instance.controller.state.link, sid, client.box, client.send, binary=False)
    with trio.fail_after(10):
        await feed.run(Room(sid, 80, 24), 10_000)
    queued = client.queued()
    assert kinds(queued)[:2] == ["Error", "Keyframe"]
    assert queued[0]["payload"]["code"] == "REPLAY_OUT_OF_RANGE"
    assert kinds(queued)[-3:] == ["Closed", "binding_goodbye", f"close {f.CLOSE_NORMAL}"]


async def test_hostd_lost_mid_stream_is_a_goodbye_and_1011(instance: Instance, hostd: LiveHostd) -> None:
    sid = await instance.session(["/bin/cat"])
    client = Client()
    feed = ReplayFeed(instance.controller.state.link, sid, client.box, client.send, binary=False)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed.run, Room(sid, 80, 24), None)
            await trio.sleep(0.2)  # subscribed: live output from now on
            await hostd.stop()
    assert kinds(client.queued())[-2:] == ["binding_goodbye", f"close {f.CLOSE_SERVER_ERROR}"]
