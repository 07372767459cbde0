"""In-memory stand-ins for the attach socket's parts' collaborators: a hostd link that records
what it is asked and plays scripted output, a sessions service, and ways to read an outbox."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from agentic_sandbox.controller.errors import ControllerError, Unavailable
from agentic_sandbox.controller.pty.lanes import Close, Item, Outbox
from agentic_sandbox.proto import messages as m

SID = "s-1"


def session_info(**fields: Any) -> m.SessionInfo:
    base: dict[str, Any] = {
        "session_id": SID,
        "instance_id": "i-1",
        "argv": ["/bin/cat"],
        "cwd": "/",
        "pid": 42,
        "cols": 80,
        "rows": 24,
        "state": "running",
        "created_at": 0.0,
    }
    return m.SessionInfo(**{**base, **fields})


@dataclass
class Post:
    request: Any
    on_error: Callable[[ControllerError], None]
    on_success: Callable[[], None] | None


class FakeLink:
    """What the parts use of :class:`controller.hostlink.HostdLink`."""

    def __init__(self, info: m.SessionInfo | None = None) -> None:
        self.info = info or session_info()
        self.posts: list[Post] = []
        self.calls: list[Any] = []
        self.post_error: ControllerError | None = None
        #: What session_output yields (an exception in it is raised there).
        self.events: list[Any] = []
        self.subscribed: list[int] = []

    async def post(
        self, request: Any, on_error: Callable[[ControllerError], None], on_success: Callable[[], None] | None = None
    ) -> None:
        if self.post_error is not None:
            raise self.post_error
        self.posts.append(Post(request, on_error, on_success))

    async def call(self, request: Any, *, timeout: float | None = None) -> Any:
        self.calls.append(request)
        return SimpleNamespace(session=self.info)

    def client(self) -> Any:
        raise Unavailable("internal.unavailable", "no hostd in this test")

    def session_output(self, session_id: str, from_seq: int, *, lost_as_lag: bool = False) -> AsyncIterator[Any]:
        self.subscribed.append(from_seq)
        return self._events()

    async def _events(self) -> AsyncIterator[Any]:
        for event in self.events:
            if isinstance(event, BaseException):
                raise event
            yield event


class FakeSessions:
    async def start(self, info: m.SessionInfo, launch: Any) -> tuple[m.SessionInfo, bool]:
        return info, False


def drain(box: Outbox) -> list[Item]:
    """Everything queued, control lane first, without waiting."""
    items: list[Item] = []
    while not box.empty():
        items.append(box._control.popleft() if box._control else box._output.popleft())
    return items


def frames(items: list[Item]) -> list[dict[str, Any]]:
    """The JSON frames among ``items`` (closes and binary frames left out)."""
    return [json.loads(item) for item in items if isinstance(item, str)]


def closes(items: list[Item]) -> list[int]:
    return [item.code for item in items if isinstance(item, Close)]
