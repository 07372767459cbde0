"""What one attach socket has yet to send: a control lane ahead of a bounded output lane.

The output lane (replayed and live output, and the frames that must stay in order with it: a lag
error and its keyframe, ``Closed``) holds :data:`OUTPUT_ITEMS` frames; its producer waits when it is
full, so a client that stops reading slows only its own hostd subscription (which hostd reports as
a lag, never holding the PTY). The control lane (replies to this client, membership, resize and
cadence keyframes broadcast by the room) goes first and never waits: past :data:`CONTROL_ITEMS`
frames the client is not reading at all, :meth:`Outbox.put_control` says so and the socket is
closed, so a broadcaster is never held by a stuck member.
"""

from __future__ import annotations

from collections import deque

import trio

OUTPUT_ITEMS = 64
CONTROL_ITEMS = 256


class Close:
    """An outbox item: close the socket with ``code`` once what is queued before it is sent."""

    def __init__(self, code: int, reason: str = "") -> None:
        self.code = code
        self.reason = reason


Item = str | bytes | Close


class Outbox:
    def __init__(self) -> None:
        self._control: deque[Item] = deque()
        self._output: deque[Item] = deque()
        self._ready = trio.Event()
        self._space = trio.Event()
        self.overflowed = False

    def put_control(self, item: Item) -> bool:
        """Queue a control frame; False (and ``overflowed``) when the client has not read 256 of them."""
        if len(self._control) >= CONTROL_ITEMS:
            self.overflowed = True
            self._ready.set()
            return False
        self._control.append(item)
        self._ready.set()
        return True

    async def put_output(self, item: Item) -> None:
        while len(self._output) >= OUTPUT_ITEMS:
            self._space = trio.Event()
            await self._space.wait()
        self._output.append(item)
        self._ready.set()

    def empty(self) -> bool:
        return not self._control and not self._output

    async def get(self) -> Item | None:
        """The next frame to send, control first; None once the control lane overflowed."""
        while not self._control and not self._output and not self.overflowed:
            self._ready = trio.Event()
            await self._ready.wait()
        if self.overflowed:
            return None
        if self._control:
            return self._control.popleft()
        item = self._output.popleft()
        self._space.set()
        return item
