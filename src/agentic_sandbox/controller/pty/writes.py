"""Posted writes: one attach socket's keystrokes to hostd, never waiting for their answers.

:class:`PostedWrites` posts an input frame's keys (:meth:`controller.hostlink.HostdLink.post`): the
echo never waits for the write's answer, and an error answer reaches the client in order, as a
``PTY_WRITE_FAILED`` session frame (a write to a session that has exited says so). At most
:data:`MAX_POSTED_WRITES` writes are unanswered at once; past that :meth:`PostedWrites.post` waits,
so a flood of input frames is backpressure on that client's own socket, never a burden on the
shared hostd connection. Keys typed while hostd upgrades in place wait for its new image (up to
:data:`~controller.hostlink.RESUME_WITHIN_S`) and are written then, in order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from agentic_sandbox.proto import messages as m

from ..errors import ControllerError, InvalidState
from ..hostlink import RESTARTING
from . import frames as f

if TYPE_CHECKING:
    from ..hostlink import HostdLink
    from .lanes import Outbox

MAX_POSTED_WRITES = 16


class PostedWrites:
    """The writes of one socket on one session (see the module docstring)."""

    def __init__(self, link: HostdLink, session_id: str, outbox: Outbox) -> None:
        self._link = link
        self._session_id = session_id
        self._outbox = outbox
        self._posted = 0
        self._answered = trio.Event()

    @property
    def unanswered(self) -> int:
        return self._posted

    async def post(self, data: bytes) -> None:
        """Post one input frame's keys; returns once they are sent, not answered."""
        while self._posted >= MAX_POSTED_WRITES:
            self._answered = trio.Event()
            await self._answered.wait()
        while True:
            request = m.SessionWriteRequest(session_id=self._session_id, data=data)
            try:
                await self._link.post(request, self._failed, self._done)
                break
            except ControllerError as exc:
                # Not sent: hostd hands over to its new image (or the link is between the two), which
                # takes it once connected; an outage past the wait is the client's to hear of.
                if (exc.code == RESTARTING or not self._link.ready) and await self._link.wait_back():
                    continue
                self._outbox.put_control(f.pty_error("PTY_WRITE_FAILED", exc.message))
                return
        # Counted after the post: an answer that came while it sent has already taken one off.
        self._posted += 1

    def _done(self) -> None:
        self._posted -= 1
        self._answered.set()

    def _failed(self, failure: ControllerError) -> None:
        self._done()
        if isinstance(failure, InvalidState):
            self._outbox.put_control(f.pty_error("PTY_WRITE_FAILED", f"the session has exited: {failure.message}"))
        else:
            self._outbox.put_control(f.pty_error("PTY_WRITE_FAILED", failure.message))
