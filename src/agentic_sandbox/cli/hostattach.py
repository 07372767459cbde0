"""``agentic-hostctl attach``: this terminal on a hostd PTY session, like ``tmux attach``.

The terminal (:class:`cli.terminal.Terminal`) is in raw mode for as long as attach runs and is
put back as it was on every way out, also after an error or SIGTERM/SIGHUP (which leave like a
detach). Keys go to the session (minus the detach keys); output is written here; SIGWINCH
resizes the session.

Each connection is opened with :func:`proto.open_hostd` and closed by its ``async with`` when
its nursery ends: on detach, on session exit, or on a failure. Only the failures a new
connection may cure (:data:`RECOVERABLE`: hostd unreachable or restarting, a timeout, output
fallen behind) are retried, up to ``--retries`` times in a row with the delays of
:data:`RECONNECT_DELAYS_S`; the count restarts once a connection has read the session again.
Nothing is retried if the first connection fails, and a remote error (e.g. the session is
gone) ends attach at once. A new connection resumes after the last sequence written here. Keys
typed while disconnected are queued and sent first; keys in flight when a connection drops are
lost, never sent twice.

The last sequence seen is kept in a cursor file per user, hostd host id and session
(:class:`cli.terminal.CursorFile`): written on detach or failure, read by the next attach,
removed when the session has exited.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from agentic_sandbox.proto import (
    HostdClient,
    HostdConnectionLost,
    HostdRemoteError,
    HostdStreamOverflow,
    HostdTimeout,
    HostdUnavailable,
    open_hostd,
)
from agentic_sandbox.proto import messages as m

from .output import PROG, UsageError, exit_text, leaf_error
from .terminal import DETACH_KEYS_HELP, CursorFile, KeyQueue, Terminal, read_keys

#: The description in ``agentic-hostctl attach --help``.
ATTACH_HELP = f"""\
Attach this terminal to a session, like `tmux attach`: raw keyboard input goes to the session,
its output comes here, and the window size follows this terminal.

Detach with {DETACH_KEYS_HELP}. On detach the last
sequence number seen is remembered (under $XDG_STATE_HOME/{PROG}) and the next attach
resumes right after it; the first attach replays what hostd's ring still holds. If the session
exits, attach prints its exit code and exits with it. A lost connection to hostd is retried a
few times with backoff and resumes from the next sequence.
"""

RECONNECT_DELAYS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
#: Failures a new connection may cure; anything else (an explicit error from hostd) ends attach.
RECOVERABLE = (HostdUnavailable, HostdTimeout, HostdStreamOverflow)


class _Attach:
    """What one attach keeps across connections."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.cursor: int | None = None  # last sequence written to the terminal
        self.exited: m.SessionExited | None = None
        self.left = False  # detach keys, SIGTERM or SIGHUP
        self.failures = 0
        #: Typed but not sent yet (e.g. while reconnecting); sent first on the next connection.
        self.keys = KeyQueue(limit=m.MAX_INPUT_BYTES)


async def _ignore_exited(call: Awaitable[Any]) -> None:
    # Input or a resize racing the session's exit: the output stream reports the exit.
    try:
        await call
    except HostdRemoteError as exc:
        if exc.code != "session.exited":
            raise


async def _keyboard(
    st: _Attach, term: Terminal, scope: trio.CancelScope, flush: Callable[[], Awaitable[None]] | None
) -> None:
    """Read keys until detach (which cancels ``scope``); ``flush`` sends them when connected."""
    if await read_keys(term, st.keys, flush):
        st.left = True
        scope.cancel()
    # Else the end of input (a pipe or file): keep showing output until the session exits.


async def _signals(
    st: _Attach, term: Terminal, scope: trio.CancelScope, resize: Callable[[], Awaitable[None]] | None
) -> None:
    await term.watch_signals(resize)  # returns on SIGTERM or SIGHUP: leave like a detach
    st.left = True
    scope.cancel()


async def _backoff(st: _Attach, term: Terminal, delay_s: float) -> None:
    """Wait before reconnecting, still honouring the detach keys and signals."""
    with trio.move_on_after(delay_s):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keyboard, st, term, nursery.cancel_scope, None)
            nursery.start_soon(_signals, st, term, nursery.cancel_scope, None)


async def _attach_connection(client: HostdClient, st: _Attach, term: Terminal) -> None:
    """Serve one connection until detach or session exit; raises if the connection fails."""
    info = (await client.call(m.SessionGetRequest(session_id=st.session_id))).session
    st.failures = 0
    start = info.first_seq if st.cursor is None else max(st.cursor + 1, info.first_seq)
    if start > info.next_seq:  # a position from some other ring (hostd restarted): replay
        start = info.first_seq
    st.cursor = start - 1

    async def resize() -> None:
        size = term.size()
        if size is not None:
            cols, rows = (min(dim, m.MAX_TERMINAL_DIM) for dim in size)
            await _ignore_exited(client.call(m.SessionResizeRequest(session_id=st.session_id, cols=cols, rows=rows)))

    async def flush() -> None:
        # Drained before the call: input in flight when the connection drops is lost, never sent twice.
        while data := st.keys.drain():
            await _ignore_exited(client.call(m.SessionWriteRequest(session_id=st.session_id, data=data)))

    async def output() -> None:
        cursor = start - 1  # st.cursor, as set above
        async with client.stream(m.SessionSubscribeRequest(session_id=st.session_id, from_seq=start)) as events:
            async for event in events:
                if isinstance(event, m.SessionOutput) and event.seq > cursor:
                    await term.write(event.data)
                    st.cursor = cursor = event.seq
                elif isinstance(event, m.SessionLagged):
                    st.cursor = cursor = event.resume_seq - 1
                elif isinstance(event, m.SessionExited):
                    st.exited = event
        if st.exited is None:
            # Ended without an exit: hostd is shutting down or the session was deleted;
            # a new connection tells which.
            raise HostdConnectionLost("hostd ended the output stream")
        nursery.cancel_scope.cancel()

    await resize()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(output)
        nursery.start_soon(_keyboard, st, term, nursery.cancel_scope, flush)
        nursery.start_soon(_signals, st, term, nursery.cancel_scope, resize)


def _start_cursor(args: argparse.Namespace, cursor_file: CursorFile) -> int | None:
    if args.from_seq is not None:
        return int(args.from_seq) - 1
    if args.replay:
        return None
    return cursor_file.load()  # None on the first attach: replay what the ring holds


async def cmd_attach(_client: None, args: argparse.Namespace) -> int:
    if not args.session_id:
        raise UsageError("attach: the session id is empty")
    st = _Attach(args.session_id)
    cursor_file: CursorFile | None = None
    try:
        with Terminal() as term:
            while not st.left:
                try:
                    async with open_hostd(args.socket, client_name=f"{PROG} attach") as client:
                        if cursor_file is None:
                            assert client.hello is not None
                            cursor_file = CursorFile.for_session(PROG, client.hello.host_id, st.session_id)
                            st.cursor = _start_cursor(args, cursor_file)
                        await _attach_connection(client, st, term)
                    break
                except* RECOVERABLE as group:
                    if cursor_file is None:
                        raise  # never connected: hostd is not there at all
                    st.failures += 1
                    if st.failures > args.retries:
                        raise HostdConnectionLost(
                            f"gave up after {args.retries} attempts to reconnect: {leaf_error(group)}"
                        ) from None
                    if st.failures == 1:
                        sys.stderr.write(
                            f"\r\n[{PROG}: connection to hostd lost ({leaf_error(group)}); reconnecting]\r\n"
                        )
                        sys.stderr.flush()
                await _backoff(st, term, RECONNECT_DELAYS_S[min(st.failures, len(RECONNECT_DELAYS_S)) - 1])
    finally:
        if cursor_file is not None and st.exited is None and st.cursor is not None:
            with contextlib.suppress(OSError):  # losing the position costs a replay, not the attach
                cursor_file.save(st.cursor)
    if st.exited is not None:
        if cursor_file is not None:
            cursor_file.remove()
        exited = st.exited
        _say(f"\n[session {st.session_id} {exit_text(exited.exit_code, exited.signal)}]")
        if exited.exit_code is not None:
            return exited.exit_code
        return 128 + exited.signal if exited.signal else 1
    _say(f"\n[detached from {st.session_id} at seq {st.cursor}]")
    return 0


def _say(line: str) -> None:
    # After SIGHUP the terminal may be gone; the exit status still tells what happened.
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr)
