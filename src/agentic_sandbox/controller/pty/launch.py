"""Starting a pending session from the attach sockets: ``pty.join_session``'s launch fields.

A session created with ``"start": false`` is pending (hostd holds it; nothing runs). The first
member to take the controller role (a join asking for it, with ``pty:control``, or
``pty.request_role``; on the legacy socket a controller join) starts it: with the join's launch
fields where it gives them, else the ones given at creation. Launch fields, upstream's
(``EX/bindings/pty_ws.rs``):

* ``argv[]`` or ``command`` (run as ``/bin/sh -lc <command>``; both is an error);
* ``cwd`` or ``working_dir`` (both, differing, is an error);
* ``env{str: str}``;
* ``terminal_size{cols, rows}``, or the schema's ``cols``/``rows`` (differing is an error);
* ``session_backend`` / ``backend`` and ``session_class``: only ``native`` and ``direct`` here.

They are checked as strictly as the admin route checks a new session's (the same types, and hostd's
checks of the instance, cwd, env and argv at the start). On a session that already runs or has
ended they are ignored, but the size: a controller's join size resizes a running session.

Concurrency: one start at a time per room (:attr:`Room.starting`), and only while the room has no
controller, so of two controllers joining at once exactly one starts it; hostd's start is
idempotent besides (a second start changes nothing), which covers any other client of hostd.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agentic_sandbox.proto import messages as m

from ..a2a.errors import to_a2a
from ..errors import ControllerError, LimitReached, Unavailable
from ..instances.sessions import Launch
from . import frames as f

if TYPE_CHECKING:
    from ..instances.sessions import SessionService
    from .rooms import Room

log = logging.getLogger(__name__)

#: What ``command`` runs in.
COMMAND_SHELL = ("/bin/sh", "-lc")
BACKENDS = frozenset({"native"})
CLASSES = frozenset({"direct"})


def join_launch(payload: f.JoinSession, request_id: str | None) -> Launch:
    """The launch a join asks for (fields it does not give are None); :class:`FrameError` when its
    fields contradict each other or ask for a session host this server does not offer."""

    def refuse(code: f.ErrorCode, message: str) -> f.FrameError:
        return f.FrameError(code, f"pty.join_session: {message}", request_id)

    for backend in (payload.session_backend, payload.backend):
        if backend is not None and backend not in BACKENDS:
            raise refuse("UNSUPPORTED_OPERATION", f"session backend {backend!r} is not offered (native only)")
    if payload.session_class is not None and payload.session_class not in CLASSES:
        raise refuse("UNSUPPORTED_OPERATION", f"session class {payload.session_class!r} is not offered (direct only)")
    if payload.argv is not None and payload.command is not None:
        raise refuse("INVALID_REQUEST", "give argv or command, not both")
    if payload.cwd is not None and payload.working_dir is not None and payload.cwd != payload.working_dir:
        raise refuse("INVALID_REQUEST", "cwd and working_dir differ")
    cols, rows = payload.cols, payload.rows
    if payload.terminal_size is not None:
        size = payload.terminal_size
        if (cols is not None and cols != size.cols) or (rows is not None and rows != size.rows):
            raise refuse("INVALID_REQUEST", "terminal_size and cols/rows differ")
        cols, rows = size.cols, size.rows
    argv = [*COMMAND_SHELL, payload.command] if payload.command is not None else payload.argv
    return Launch(
        argv=argv,
        cwd=payload.cwd if payload.cwd is not None else payload.working_dir,
        env=payload.env,
        cols=cols,
        rows=rows,
    )


def names_a_command(launch: Launch) -> bool:
    """Whether the launch says more than a terminal size (what a running session ignores)."""
    return launch.argv is not None or launch.cwd is not None or launch.env is not None


async def start_pending(sessions: SessionService, room: Room, info: m.SessionInfo, launch: Launch) -> bool:
    """Start the room's session if it is pending and has no controller yet; whether this started it.

    Raises :class:`~controller.errors.ControllerError` (the session stays pending). The room's
    screen takes the size it starts with, and every member is told (Resize) before the session
    can write a byte at that size; a start that fails puts the size back.
    """
    if not room.pending:
        return False
    async with room.starting:
        if not room.pending or room.controllers():
            return False
        before = room.screen.size
        _resize(room, launch.cols or info.cols, launch.rows or info.rows)
        try:
            now, started = await sessions.start(info, launch)
        except BaseException:
            _resize(room, *before)
            raise
        room.pending = now.pending
        _resize(room, now.cols, now.rows)  # another client's start may have chosen another
    if not started and names_a_command(launch):
        log.info("session %s was started by another client: this join's launch fields are ignored", info.session_id)
    return started


def _resize(room: Room, cols: int, rows: int) -> None:
    if (cols, rows) != room.screen.size:
        room.resized(cols, rows)


def start_failure(exc: ControllerError, request_id: str | None) -> f.FrameError:
    """A failed start as the binding says it: the caller's fields (or the session's state) are
    INVALID_REQUEST; hostd at a limit (its session table full) is RATE_LIMITED, retryable where
    waiting helps, the limit named in the frame's ``a2a_error``; hostd away is INTERNAL, worth
    retrying."""
    message = f"cannot start the session: {exc.message}"
    if isinstance(exc, LimitReached):
        a2a_error = to_a2a(exc).body()["error"]
        return f.FrameError(
            "RATE_LIMITED", message, request_id, retryable=exc.retry_after_s is not None, a2a_error=a2a_error
        )
    if isinstance(exc, Unavailable):
        return f.FrameError("INTERNAL", message, request_id, retryable=True)
    return f.FrameError("INVALID_REQUEST", message, request_id)
