"""Turns at writing one connection: small frames go first.

A connection carries many streams. A keystroke's echo or a call's answer must not wait behind
other sessions' bulk output: when the writer leaves, a waiting small write (at most
:data:`URGENT_BYTES`) takes the turn before any waiting bulk write, each kind in arrival order.
What a bulk writer holds the turn for is bounded by its caller (a subscriber's batch, 64 KiB) and
by the connection's send buffer, so an urgent write waits for at most that much.
"""

from __future__ import annotations

from collections import deque

import trio

#: Writes up to this size are urgent.
URGENT_BYTES = 4096


class SendTurns:
    """One writer at a time; urgent waiters before bulk ones (see the module docstring)."""

    def __init__(self) -> None:
        self._busy = False
        self._urgent: deque[trio.Event] = deque()
        self._bulk: deque[trio.Event] = deque()

    async def take(self, size: int) -> None:
        """Wait for the turn to write ``size`` bytes; returns without yielding when it is free."""
        if not self._busy:
            self._busy = True
            return
        handed = trio.Event()
        queue = self._urgent if size <= URGENT_BYTES else self._bulk
        queue.append(handed)
        try:
            await handed.wait()
        except BaseException:
            if handed.is_set():
                self.give()  # handed over as we were cancelled: pass it on
            else:
                queue.remove(handed)
            raise

    def give(self) -> None:
        """End the turn: hand it to the next waiter (urgent first), or free it."""
        queue = self._urgent or self._bulk
        if queue:
            queue.popleft().set()  # the turn passes on directly; it is never free in between
        else:
            self._busy = False
