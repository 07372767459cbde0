"""``agentic attach | sessions | session new``: terminals in an instance over the pty-ws/v1 binding.

``attach`` is like ``kubectl exec -it``: raw mode (:class:`cli.terminal.Terminal`, put back as it
was on every way out), keys go to the session as ``PW1I`` frames, output arrives as ``PW1O`` frames
(the binary subprotocol), the window size follows this terminal, and the detach keys leave. A fresh
attach paints the screen from the join's keyframe, then shows what follows it. If the connection
drops (the controller restarted, the network blinked) attach reconnects by itself with
``replay_from`` the last sequence written here, so nothing is lost or shown twice; only failures a
new connection may cure are retried (:data:`RECONNECT_DELAYS_S`, up to ``--retries`` in a row),
and never before the first connection succeeded. ``--observe`` joins as an observer: keys other
than the detach keys are dropped. The app-level pings of the binding are answered, so an idle
attach is never reaped. ``attach ... -- ARGV`` starts a pending session (``session new --pending``)
with ARGV: it goes in the join's launch fields (a session that runs already ignores them); a start
the server refuses ends the attach with its reason.

Each connection is one nursery (output, keyboard, signals); leaving it closes the socket.
"""

from __future__ import annotations

import argparse
import base64
import json
import struct
import sys
from datetime import UTC, datetime
from typing import Any

import trio
from trio_websocket import ConnectionClosed, HandshakeError, WebSocketConnection, open_websocket_url

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import new_id

from .controllerapi import Api, ApiError
from .terminal import DETACH_KEYS_HELP, KeyQueue, Terminal, read_keys

PROG = "agentic"
SUBPROTOCOL = "pty-ws.v1.binary"
RECONNECT_DELAYS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0)
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_OUTPUT = struct.Struct(">4sQB")

ATTACH_HELP = f"""\
Attach this terminal to a session in an instance, like `kubectl exec -it`: raw keyboard input goes
to the session, its output comes here, and the window size follows this terminal.

Detach with {DETACH_KEYS_HELP}. A lost connection (e.g. a controller restart) is retried with
backoff and resumes right after the last output shown. --observe joins read-only.

A pending session (`session new --pending`) starts when its first controller attaches: with
`-- ARGV` if given, else with what it was created with. On a running session -- ARGV is ignored.
"""


def _frame(op: str, payload: dict[str, Any] | None = None, **extra: Any) -> str:
    ts = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return json.dumps({"op": op, "id": new_id(), "ts": ts, "payload": payload or {}, **extra})


class _Attach:
    """What one attach keeps across connections."""

    def __init__(self, observe: bool, argv: list[str]) -> None:
        self.observe = observe
        #: Launch argv for a pending session (the join's launch field; ignored once it runs).
        self.argv = argv
        #: The id of the join frame, and why the server refused it (a pending session not started).
        self.join_id = ""
        self.refused: str | None = None
        self.cursor: int | None = None  # last sequence written to the terminal
        self.paint_keyframe = True  # the next keyframe is drawn (fresh attach, after a lag)
        self.closed: dict[str, Any] | None = None
        self.left = False
        self.failures = 0
        self.keys = KeyQueue(limit=m.MAX_INPUT_BYTES)
        self.notice: str | None = None


async def _output(ws: WebSocketConnection, st: _Attach, term: Terminal, scope: trio.CancelScope) -> None:
    while True:
        message = await ws.get_message()
        if isinstance(message, bytes):
            magic, seq, _stream = _OUTPUT.unpack_from(message)
            if magic == b"PW1O" and (st.cursor is None or seq > st.cursor):
                await term.write(message[_OUTPUT.size :])
                st.cursor = seq
            continue
        frame = json.loads(message)
        op, payload = frame.get("op"), frame.get("payload") or {}
        if op == "ping":
            await ws.send_message(_frame("pong", {"client_ts": payload.get("client_ts", "")}))
        elif op == "Error" and payload.get("code") == "REPLAY_OUT_OF_RANGE":
            st.paint_keyframe = True
        elif op == "Error" and frame.get("id") == st.join_id:
            st.refused = str(payload.get("message", payload.get("code")))
            scope.cancel()
            return
        elif op == "pty.session_frame":
            kind = payload.get("kind")
            if kind == "Keyframe" and st.paint_keyframe:
                st.paint_keyframe = False
                await term.write(base64.b64decode(payload["snapshot"]))
                st.cursor = int(payload["anchor_sequence"])
            elif kind == "Error" and payload.get("code") == "PTY_OUTPUT_LAGGED":
                st.paint_keyframe = True
            elif kind == "RoleAssigned" and not st.observe and payload.get("role") != "controller":
                st.notice = f"joined as an observer ({payload.get('reason', 'the session has its controller')})"
            elif kind == "Closed":
                st.closed = payload
        elif op == "binding_goodbye" and payload.get("reason") == "session_closed" and st.closed is not None:
            scope.cancel()
            return


async def _connection(api: Api, url: str, st: _Attach, term: Terminal) -> None:
    query = "" if st.cursor is None else f"?replay_from={st.cursor}"
    headers = [(name.encode(), value.encode()) for name, value in api.auth_headers.items()]
    async with open_websocket_url(
        url + query,
        ssl_context=api.tls,
        subprotocols=[SUBPROTOCOL],
        extra_headers=headers,
        max_message_size=MAX_MESSAGE_BYTES,
        receive_buffer_size=256 * 1024,
        connect_timeout=10,
        disconnect_timeout=2,
    ) as ws:
        st.failures = 0
        size = term.size()
        join: dict[str, Any] = {"role": "observer" if st.observe else "controller", "client_label": PROG}
        if size is not None and not st.observe:
            join["cols"], join["rows"] = (min(dim, m.MAX_TERMINAL_DIM) for dim in size)
        if st.argv and not st.observe:
            join["argv"] = st.argv
        st.join_id = new_id()
        await ws.send_message(_frame("pty.join_session", join, id=st.join_id))

        async def flush() -> None:
            data = st.keys.drain()
            if data and not st.observe:
                await ws.send_message(b"PW1I" + data)

        async def resize() -> None:
            size = term.size()
            if size is not None and not st.observe:
                cols, rows = (min(dim, m.MAX_TERMINAL_DIM) for dim in size)
                await ws.send_message(_frame("pty.session_resize", {"cols": cols, "rows": rows}))

        async def keyboard() -> None:
            if await read_keys(term, st.keys, flush):
                st.left = True
                nursery.cancel_scope.cancel()

        async def signals() -> None:
            await term.watch_signals(resize)
            st.left = True
            nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(_output, ws, st, term, nursery.cancel_scope)
            nursery.start_soon(keyboard)
            nursery.start_soon(signals)


async def _backoff(st: _Attach, term: Terminal, delay_s: float) -> None:
    """Wait before reconnecting, still honouring the detach keys and signals."""
    with trio.move_on_after(delay_s):
        async with trio.open_nursery() as nursery:

            async def keyboard() -> None:
                if await read_keys(term, st.keys, None):
                    st.left = True
                    nursery.cancel_scope.cancel()

            async def signals() -> None:
                await term.watch_signals(None)
                st.left = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(keyboard)
            nursery.start_soon(signals)


RECOVERABLE = (ConnectionClosed, HandshakeError, OSError)


async def cmd_attach(api: Api, args: argparse.Namespace) -> int:
    iid = await api.instance_id(args.instance)
    url = f"{api.ws_base}/agents/{iid}/sessions/{args.session_id}/attach"
    session = await api.call("GET", f"{api.sessions_path(iid)}/{args.session_id}")  # a clear 404 before raw mode
    if args.argv and session.get("state") != "pending":
        _say(f"[agentic: session {args.session_id} is {session.get('state')}: the command after -- is ignored]\n")
    st = _Attach(args.observe, list(args.argv or []))
    connected = False
    with Terminal() as term:
        while not st.left and st.closed is None and st.refused is None:
            try:
                await _connection(api, url, st, term)
                connected = True
                if st.closed is None and not st.left and st.refused is None:
                    raise ConnectionClosed(None)  # the server ended the socket: reconnect
            except* RECOVERABLE as group:
                if not connected and st.cursor is None:
                    raise ApiError(0, "", f"cannot attach: {group.exceptions[0]!r}") from None
                connected = True
                st.failures += 1
                if st.failures > args.retries:
                    raise ApiError(0, "", f"gave up after {args.retries} attempts to reconnect") from None
                if st.failures == 1:
                    _say("\r\n[agentic: connection lost; reconnecting]\r\n")
            if st.notice:
                _say(f"\r\n[agentic: {st.notice}]\r\n")
                st.notice = None
            if not st.left and st.closed is None and st.refused is None:
                await _backoff(st, term, RECONNECT_DELAYS_S[min(st.failures, len(RECONNECT_DELAYS_S)) - 1])
    if st.refused is not None:
        raise ApiError(0, "", f"cannot attach to {args.session_id}: {st.refused}")
    if st.closed is not None:
        code = st.closed.get("exit_code")
        _say(f"\n[session {args.session_id} ended: {st.closed.get('reason')}, exit code {code}]\n")
        return int(code) if isinstance(code, int) else 1
    _say(f"\n[detached from {args.session_id} at seq {st.cursor}]\n")
    return 0


async def cmd_sessions(api: Api, args: argparse.Namespace) -> int:
    iid = await api.instance_id(args.instance)
    items = (await api.call("GET", api.sessions_path(iid)))["items"]
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    rows = [["ID", "STATE", "PID", "SIZE", "EXIT", "ARGV"]]
    for item in items:
        exit_code = "" if item.get("exit_code") is None else str(item["exit_code"])
        size = f"{item['cols']}x{item['rows']}"
        rows.append([item["id"], item["state"], str(item.get("pid") or ""), size, exit_code, " ".join(item["argv"])])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
    return 0


async def cmd_session_new(api: Api, args: argparse.Namespace) -> int:
    iid = await api.instance_id(args.instance)
    body: dict[str, Any] = {}
    if args.argv:
        body["argv"] = args.argv
    if args.cwd:
        body["cwd"] = args.cwd
    env = {}
    for item in args.env or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ApiError(0, "", f"--env {item!r}: expected NAME=VALUE")
        env[name] = value
    if env:
        body["env"] = env
    if args.cols or args.rows:
        body["size"] = {k: v for k, v in (("cols", args.cols), ("rows", args.rows)) if v}
    if args.pending:
        body["start"] = False
    session = await api.call("POST", api.sessions_path(iid), body)
    print(json.dumps(session, indent=2) if args.json else session["id"])
    return 0


def register(sub: Any) -> None:
    """Add ``attach``, ``sessions`` and ``session new`` to the ``agentic`` subcommands."""
    p = sub.add_parser(
        "attach",
        help="attach this terminal to a session (detach: Ctrl-] or Ctrl-B d)",
        description=ATTACH_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("instance", metavar="INSTANCE", help="instance id or name")
    p.add_argument("session_id", metavar="SESSION")
    p.add_argument("--observe", action="store_true", help="join read-only, as an observer")
    p.add_argument("--retries", type=int, default=len(RECONNECT_DELAYS_S), metavar="N", help="reconnect attempts")
    p.usage = f"{PROG} attach [options] INSTANCE SESSION [-- ARGV ...]"
    p.set_defaults(func=cmd_attach)

    p = sub.add_parser("sessions", help="list the PTY sessions of an instance")
    p.add_argument("instance", metavar="INSTANCE", help="instance id or name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_sessions)

    p = sub.add_parser("session", help="session commands")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    q = verbs.add_parser("new", help="start a session: session new INSTANCE [-- ARGV...]; prints its id")
    q.add_argument("instance", metavar="INSTANCE", help="instance id or name")
    q.add_argument("--pending", action="store_true", help="start nothing yet: the first controller to attach starts it")
    q.add_argument("--cwd")
    q.add_argument("--env", action="append", metavar="NAME=VALUE")
    q.add_argument("--cols", type=int)
    q.add_argument("--rows", type=int)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_session_new)


def _say(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except OSError:
        pass
