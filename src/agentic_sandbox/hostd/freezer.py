"""Parking a registry's I/O tasks for a handover, and letting them go again.

An upgrade in place (:mod:`hostd.upgrade`) writes down every session's and exec's state and replaces
hostd's image. For that state to be whole, nothing may be half-way through moving bytes at that
moment: a chunk read from a PTY but not yet in the ring, or a write half done, would be lost or
doubled. A :class:`Freezer` is the one switch for that. The loops that move bytes run under
:meth:`Freezer.run`: :meth:`Freezer.freeze` cancels each one at its next checkpoint (every loop run
this way gives up nothing when cancelled: what it read is stored before it awaits again) and parks
it; :meth:`Freezer.thaw` (a handover that failed) starts each again where its state says. Reaping is
held off too (:meth:`Freezer.thawed`): a child reaped in the old image would leave the new one an
exit status only the document could carry, so a child that exits meanwhile stays a zombie for the new
image to reap.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio


class Freezer:
    """See the module docstring. One per registry; used from the trio thread only."""

    def __init__(self) -> None:
        self.frozen = False
        self._scopes: set[trio.CancelScope] = set()
        self._thawed = trio.Event()
        self._thawed.set()
        #: Loops under :meth:`run` that are not parked (still between their cancel and the park).
        self._moving = 0
        self._still = trio.Event()
        self._still.set()

    async def run(self, loop: Callable[[], Awaitable[None]]) -> None:
        """Run ``loop`` until it returns; a freeze cancels it and it is run again once thawed.

        ``loop`` must be restartable: all it needs to go on is kept outside it.
        """
        while True:
            await self.thawed()
            with trio.CancelScope() as scope:
                self._scopes.add(scope)
                self._moving += 1
                try:
                    if self.frozen:  # frozen while this task waited to be scheduled
                        scope.cancel()
                    await loop()
                    return
                finally:
                    self._scopes.discard(scope)
                    self._moving -= 1
                    if self._moving == 0:
                        self._still.set()

    async def thawed(self) -> None:
        """Return once no freeze is on (at once, without a checkpoint, when none is)."""
        if self.frozen:
            await self._thawed.wait()

    async def freeze(self) -> None:
        """Cancel every loop under :meth:`run` and return once each has stopped."""
        self.frozen = True
        self._thawed = trio.Event()
        if self._moving:
            self._still = trio.Event()
        for scope in self._scopes:
            scope.cancel()
        await self._still.wait()

    def thaw(self) -> None:
        """Let every parked loop go on (a handover that did not happen)."""
        self.frozen = False
        self._thawed.set()
