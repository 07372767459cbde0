"""``agentic-hostctl``: drive hostd from a shell (status, instances, PTY sessions, attach).

Every command opens one connection with :func:`proto.open_hostd`, makes its calls and exits.
``attach`` is the exception: it keeps the terminal in raw mode for as long as it runs and
opens a new connection whenever one is lost (see :func:`cmd_attach`).

Error handling: every ``HostdError`` becomes one line on stderr and exit status 1; usage errors
exit 2 (argparse's convention); nothing prints a traceback for an expected failure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import stat
import sys
import termios
import tty
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any, NoReturn

import msgspec
import trio

from proto import (
    HostdClient,
    HostdConnectionLost,
    HostdError,
    HostdNotRunning,
    HostdProtocolError,
    HostdRemoteError,
    HostdStreamOverflow,
    HostdTimeout,
    HostdUnavailable,
    HostdVersionMismatch,
    new_id,
    open_hostd,
)
from proto import messages as m

from .config import PROD_SOCKET

PROG = "agentic-hostctl"
DEV_SOCKET = os.path.join(".run", "hostd.sock")
DEFAULT_INSTANCE_NAME = "dev"
#: Bound for calls that wait for process trees to end (stop, destroy, kill, delete) beyond their grace.
TREE_CALL_TIMEOUT_S = 120.0


class UsageError(Exception):
    """The command line asks for something that cannot work; exit status 2."""


def default_socket(env: dict[str, str] | None = None) -> str:
    """$AIWG_HOSTD_SOCKET, else ./.run/hostd.sock if it exists (a dev hostd), else production."""
    env = dict(os.environ) if env is None else env
    if env.get("AIWG_HOSTD_SOCKET"):
        return env["AIWG_HOSTD_SOCKET"]
    if os.path.exists(DEV_SOCKET):
        return os.path.abspath(DEV_SOCKET)
    return PROD_SOCKET


def _pairs(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} {item!r} is not of the form KEY=VALUE")
        out[key] = value
    return out


# -- output -------------------------------------------------------------------------------------


def _plain(obj: Any) -> Any:
    """Builtins for JSON output, without the wire-only tag and request id."""
    data = msgspec.to_builtins(obj)
    if isinstance(data, dict):
        data.pop("t", None)
        data.pop("id", None)
    return data


def _print_json(obj: Any) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(_plain(obj)), indent=2).decode() + "\n")


def _print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    for row in [headers, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _tree_timeout(grace_s: float | None) -> float:
    return (grace_s or 0.0) + TREE_CALL_TIMEOUT_S


def _opt(value: object) -> str:
    return "-" if value is None else str(value)


def _exit_text(exit_code: int | None, signum: int | None) -> str:
    if signum:
        return f"killed by signal {signum}"
    return f"exited with code {exit_code}"


# -- lookups ------------------------------------------------------------------------------------


async def _resolve_instance(client: HostdClient, ref: str) -> str:
    """An instance id, given its id or its (unique) name."""
    try:
        return (await client.call(m.InstanceGetRequest(instance_id=ref))).instance.instance_id
    except HostdRemoteError as exc:
        if exc.code not in ("instance.not_found", "request.invalid"):
            raise
        not_found = exc
    named = [i for i in (await client.call(m.InstanceListRequest())).instances if i.name == ref]
    if len(named) == 1:
        return named[0].instance_id
    if len(named) > 1:
        raise UsageError(f"{len(named)} instances are named {ref!r}; give the instance id")
    raise not_found


async def _default_instance(client: HostdClient) -> str:
    for info in (await client.call(m.InstanceListRequest())).instances:
        if info.name == DEFAULT_INSTANCE_NAME and info.state != "destroyed":
            return info.instance_id
    raise UsageError(
        f"no --instance given and no instance named {DEFAULT_INSTANCE_NAME!r} exists "
        f"(create one: {PROG} instance create {DEFAULT_INSTANCE_NAME})"
    )


# -- commands -----------------------------------------------------------------------------------


async def cmd_status(client: HostdClient, args: argparse.Namespace) -> int:
    resp = await client.call(m.StatusRequest())
    if args.json:
        _print_json(resp)
    else:
        for key, value in _plain(resp).items():
            print(f"{key + ':':<18} {_opt(value)}")
    return 0


async def cmd_instances(client: HostdClient, args: argparse.Namespace) -> int:
    infos = (await client.call(m.InstanceListRequest())).instances
    if args.json:
        _print_json(infos)
        return 0
    rows = [[i.instance_id, i.name, i.state, _opt(i.pid), str(i.sessions), str(i.execs), i.working_dir] for i in infos]
    _print_table(["INSTANCE", "NAME", "STATE", "PID", "SESSIONS", "EXECS", "WORKDIR"], rows)
    return 0


def _print_instance(info: m.InstanceInfo, args: argparse.Namespace) -> None:
    if args.json:
        _print_json(info)
    else:
        print(f"{info.instance_id} {info.state}" + (f" ({info.note})" if info.note else ""))


async def cmd_instance_create(client: HostdClient, args: argparse.Namespace) -> int:
    request = m.InstanceProvisionRequest(
        instance_id=args.id or new_id(),
        name=args.name,
        working_dir=os.path.abspath(args.workdir) if args.workdir else None,
        env=_pairs(args.env, "--env"),
        labels=_pairs(args.label, "--label"),
        command=args.argv or None,
        start=not args.no_start,
    )
    _print_instance((await client.call(request)).instance, args)
    return 0


async def cmd_instance_start(client: HostdClient, args: argparse.Namespace) -> int:
    instance_id = await _resolve_instance(client, args.instance)
    _print_instance((await client.call(m.InstanceStartRequest(instance_id=instance_id))).instance, args)
    return 0


async def cmd_instance_stop(client: HostdClient, args: argparse.Namespace) -> int:
    instance_id = await _resolve_instance(client, args.instance)
    request = m.InstanceStopRequest(instance_id=instance_id, grace_s=args.grace)
    _print_instance((await client.call(request, timeout=_tree_timeout(args.grace))).instance, args)
    return 0


async def cmd_instance_destroy(client: HostdClient, args: argparse.Namespace) -> int:
    instance_id = await _resolve_instance(client, args.instance)
    request = m.InstanceDestroyRequest(instance_id=instance_id, grace_s=args.grace)
    _print_instance((await client.call(request, timeout=_tree_timeout(args.grace))).instance, args)
    return 0


async def cmd_session_new(client: HostdClient, args: argparse.Namespace) -> int:
    if not args.argv:
        raise UsageError("session new: give the command to run after --, e.g. session new -- bash")
    instance_id = await (_resolve_instance(client, args.instance) if args.instance else _default_instance(client))
    request = m.SessionCreateRequest(
        instance_id=instance_id,
        argv=args.argv,
        cwd=os.path.abspath(args.cwd) if args.cwd else None,
        env=_pairs(args.env, "--env"),
        cols=args.cols,
        rows=args.rows,
        session_id=args.id,
    )
    session = (await client.call(request)).session
    if args.json:
        _print_json(session)
    else:
        print(session.session_id)
    return 0


async def cmd_session_delete(client: HostdClient, args: argparse.Namespace) -> int:
    await client.call(m.SessionDeleteRequest(session_id=args.session_id), timeout=_tree_timeout(None))
    return 0


async def cmd_sessions(client: HostdClient, args: argparse.Namespace) -> int:
    instance_id = await _resolve_instance(client, args.instance) if args.instance else None
    sessions = (await client.call(m.SessionListRequest(instance_id=instance_id))).sessions
    if args.json:
        _print_json(sessions)
        return 0
    rows = [
        [
            s.session_id,
            s.instance_id,
            s.state if s.state == "running" else _exit_text(s.exit_code, s.signal),
            _opt(s.pid),
            f"{s.first_seq}-{s.next_seq - 1}" if s.next_seq > s.first_seq else "-",
            " ".join(s.argv),
        ]
        for s in sessions
    ]
    _print_table(["SESSION", "INSTANCE", "STATE", "PID", "SEQ", "COMMAND"], rows)
    return 0


async def cmd_logs(client: HostdClient, args: argparse.Namespace) -> int:
    info = (await client.call(m.SessionGetRequest(session_id=args.session_id))).session
    start = info.first_seq if args.from_seq is None else args.from_seq
    end = info.next_seq  # without --follow: what the ring held when we asked
    if not args.follow and start >= end:
        return 0
    out = sys.stdout.buffer
    request = m.SessionSubscribeRequest(session_id=args.session_id, from_seq=start)
    async with client.stream(request) as events, aclosing(events):  # type: ignore[type-var]
        async for event in events:
            if isinstance(event, m.SessionOutput):
                out.write(event.data)
                out.flush()
                if not args.follow and event.seq >= end - 1:
                    break
            elif isinstance(event, m.SessionLagged):
                print(f"[{PROG}: output {event.missed_from}..{event.resume_seq - 1} left the ring]", file=sys.stderr)
                if not args.follow and event.resume_seq >= end:
                    break
    return 0


async def cmd_send(client: HostdClient, args: argparse.Namespace) -> int:
    data = args.text.encode() + (b"\r" if args.newline else b"")
    written = (await client.call(m.SessionWriteRequest(session_id=args.session_id, data=data))).written
    if args.json:
        _print_json({"written": written})
    return 0


async def cmd_kill(client: HostdClient, args: argparse.Namespace) -> int:
    if args.signal is not None:
        sig: str | int = int(args.signal) if args.signal.isdigit() else args.signal
        await client.call(m.SessionSignalRequest(session_id=args.session_id, signal=sig))
        if args.json:
            _print_json({"session_id": args.session_id, "signal": sig})
        return 0
    request = m.SessionKillRequest(session_id=args.session_id, grace_s=args.grace)
    session = (await client.call(request, timeout=_tree_timeout(args.grace))).session
    if args.json:
        _print_json(session)
    else:
        print(f"{session.session_id} {_exit_text(session.exit_code, session.signal)}")
    return 0


# -- attach -------------------------------------------------------------------------------------

DETACH_KEY = 0x1D  # Ctrl-]
PREFIX_KEY = 0x02  # Ctrl-B, then d
RECONNECT_DELAYS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
#: Failures a new connection may cure; anything else (an explicit error from hostd) ends attach.
RECOVERABLE = (HostdUnavailable, HostdTimeout, HostdStreamOverflow)


class DetachKeys:
    """Finds the detach keys in typed input: Ctrl-] alone, or Ctrl-B then d (tmux's prefix)."""

    def __init__(self) -> None:
        self._prefixed = False

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """Bytes to forward, and whether to detach (input after the detach key is dropped)."""
        if not self._prefixed and DETACH_KEY not in data and PREFIX_KEY not in data:
            return data, False
        out = bytearray()
        for byte in data:
            if self._prefixed:
                self._prefixed = False
                if byte == ord("d"):
                    return bytes(out), True
                out.append(PREFIX_KEY)  # Ctrl-B Ctrl-B sends one Ctrl-B; Ctrl-B x sends both
                if byte != PREFIX_KEY:
                    out.append(byte)
            elif byte == DETACH_KEY:
                return bytes(out), True
            elif byte == PREFIX_KEY:
                self._prefixed = True  # held until the next byte says what it was
            else:
                out.append(byte)
        return bytes(out), False


def _pollable(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


class _Terminal:
    """The user's terminal while attached: raw mode, and async I/O on dups of fds 0 and 1.

    FdStream makes the open file description non-blocking, and fds 0/1 share it with the shell
    that started us, so the original blocking modes and tty attributes are put back on exit.
    Files and /dev/null cannot be polled: those are read in a thread and written directly.
    """

    def __init__(self) -> None:
        self.is_tty = os.isatty(0)
        self._saved: list[Any] | None = None
        self._blocking = {fd: os.get_blocking(fd) for fd in (0, 1)}
        self._in: trio.lowlevel.FdStream | None = None
        self._out: trio.lowlevel.FdStream | None = None

    def __enter__(self) -> _Terminal:
        if self.is_tty:
            self._saved = termios.tcgetattr(0)
            tty.setraw(0)
        self._in = trio.lowlevel.FdStream(os.dup(0)) if _pollable(0) else None
        self._out = trio.lowlevel.FdStream(os.dup(1)) if _pollable(1) else None
        return self

    def __exit__(self, *exc_info: object) -> None:
        for stream in (self._in, self._out):
            if stream is not None:
                stream.close()
        if self._saved is not None:
            termios.tcsetattr(0, termios.TCSADRAIN, self._saved)
        for fd, blocking in self._blocking.items():
            os.set_blocking(fd, blocking)

    async def read(self, max_bytes: int = 65536) -> bytes:
        if self._in is not None:
            return await self._in.receive_some(max_bytes)
        return await trio.to_thread.run_sync(os.read, 0, max_bytes)

    async def write(self, data: bytes) -> None:
        if self._out is not None:
            await self._out.send_all(data)
            return
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]

    def size(self) -> tuple[int, int] | None:
        if not self.is_tty:
            return None
        try:
            cols, rows = os.get_terminal_size(0)
        except OSError:
            return None
        return max(1, min(cols, m.MAX_TERMINAL_DIM)), max(1, min(rows, m.MAX_TERMINAL_DIM))


def _cursor_file(host_id: str, session_id: str) -> Path:
    """Where the last sequence seen is kept between attaches (per user, per hostd host id)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "agentic-hostctl" / "attach" / host_id / session_id


class _Attach:
    """What one attach keeps across connections."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.cursor: int | None = None  # last sequence written to the terminal
        self.exited: m.SessionExited | None = None
        self.detached = False
        self.failures = 0
        self.keys = DetachKeys()
        #: Typed but not sent yet (e.g. while reconnecting); sent first on the next connection.
        self.pending = bytearray()

    def take_keys(self, data: bytes) -> bool:
        """Queue typed bytes; True once the user asked to detach."""
        forward, detach = self.keys.feed(data)
        self.pending += forward[: m.MAX_INPUT_BYTES - len(self.pending)]
        self.detached = self.detached or detach
        return detach


async def _ignore_exited(call: Awaitable[Any]) -> None:
    # Input or a resize racing the session's exit: the output stream reports the exit.
    try:
        await call
    except HostdRemoteError as exc:
        if exc.code != "session.exited":
            raise


async def _keyboard(
    st: _Attach, term: _Terminal, scope: trio.CancelScope, flush: Callable[[], Awaitable[None]] | None
) -> None:
    """Read keys until detach (which cancels ``scope``); ``flush`` sends them when connected."""
    if flush is not None:
        await flush()
    while data := await term.read():
        detach = st.take_keys(data)
        if flush is not None:
            await flush()
        if detach:
            scope.cancel()
            return
    # End of input (a pipe or file): keep showing output until the session exits.


async def _signals(
    st: _Attach, signals: Any, scope: trio.CancelScope, resize: Callable[[], Awaitable[None]] | None
) -> None:
    async for signum in signals:
        if signum != signal.SIGWINCH:  # SIGTERM, SIGHUP: leave like a detach, terminal restored
            st.detached = True
            scope.cancel()
            return
        if resize is not None:
            await resize()


async def _backoff(st: _Attach, term: _Terminal, signals: Any, delay_s: float) -> None:
    """Wait before reconnecting, still honouring the detach keys and signals."""
    with trio.move_on_after(delay_s):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keyboard, st, term, nursery.cancel_scope, None)
            nursery.start_soon(_signals, st, signals, nursery.cancel_scope, None)


async def _attach_connection(client: HostdClient, st: _Attach, term: _Terminal, signals: Any) -> None:
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
            request = m.SessionResizeRequest(session_id=st.session_id, cols=size[0], rows=size[1])
            await _ignore_exited(client.call(request))

    async def flush() -> None:
        # Taken before the call: input in flight when the connection drops is lost, never sent twice.
        while st.pending:
            data = bytes(st.pending)
            st.pending.clear()
            await _ignore_exited(client.call(m.SessionWriteRequest(session_id=st.session_id, data=data)))

    async def output() -> None:
        cursor = st.cursor
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
        nursery.start_soon(_signals, st, signals, nursery.cancel_scope, resize)


def _start_cursor(args: argparse.Namespace, cursor_file: Path) -> int | None:
    if args.from_seq is not None:
        return int(args.from_seq) - 1
    if args.replay:
        return None
    try:
        return int(cursor_file.read_text())
    except (OSError, ValueError):
        return None  # first attach: replay what the ring holds


async def cmd_attach(_client: None, args: argparse.Namespace) -> int:
    st = _Attach(args.session_id)
    cursor_file: Path | None = None
    try:
        with _Terminal() as term, trio.open_signal_receiver(signal.SIGWINCH, signal.SIGTERM, signal.SIGHUP) as sigs:
            while not st.detached:
                try:
                    async with open_hostd(args.socket, client_name=f"{PROG} attach") as client:
                        if cursor_file is None:
                            assert client.hello is not None
                            cursor_file = _cursor_file(client.hello.host_id, st.session_id)
                            st.cursor = _start_cursor(args, cursor_file)
                        await _attach_connection(client, st, term, sigs)
                    break
                except* RECOVERABLE as group:
                    if cursor_file is None:
                        raise  # never connected: hostd is not there at all
                    st.failures += 1
                    if st.failures > args.retries:
                        raise HostdConnectionLost(
                            f"gave up after {args.retries} attempts to reconnect: {_leaf(group)}"
                        ) from None
                    if st.failures == 1:
                        sys.stderr.write(f"\r\n[{PROG}: connection to hostd lost ({_leaf(group)}); reconnecting]\r\n")
                        sys.stderr.flush()
                await _backoff(st, term, sigs, RECONNECT_DELAYS_S[min(st.failures, len(RECONNECT_DELAYS_S)) - 1])
    finally:
        if cursor_file is not None and st.exited is None and st.cursor is not None:
            with contextlib.suppress(OSError):
                cursor_file.parent.mkdir(parents=True, exist_ok=True)
                cursor_file.write_text(f"{st.cursor}\n")
    if st.exited is not None:
        if cursor_file is not None:
            cursor_file.unlink(missing_ok=True)
        exited = st.exited
        _say(f"\n[session {st.session_id} {_exit_text(exited.exit_code, exited.signal)}]")
        if exited.exit_code is not None:
            return exited.exit_code
        return 128 + exited.signal if exited.signal else 1
    _say(f"\n[detached from {st.session_id} at seq {st.cursor}]")
    return 0


def _say(line: str) -> None:
    # After SIGHUP the terminal may be gone; the exit status still tells what happened.
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr)


# -- parser -------------------------------------------------------------------------------------

ATTACH_HELP = """\
Attach this terminal to a session, like `tmux attach`: raw keyboard input goes to the session,
its output comes here, and the window size follows this terminal.

Detach with Ctrl-] or with Ctrl-B then d (Ctrl-B Ctrl-B sends one Ctrl-B). On detach the last
sequence number seen is remembered (under $XDG_STATE_HOME/agentic-hostctl) and the next attach
resumes right after it; the first attach replays what hostd's ring still holds. If the session
exits, attach prints its exit code and exits with it. A lost connection to hostd is retried a
few times with backoff and resumes from the next sequence.
"""


def _common() -> argparse.ArgumentParser:
    # Accepted before or after the command; SUPPRESS keeps a later default from hiding an earlier value.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--socket", default=argparse.SUPPRESS, help="hostd socket (default: see above)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog=PROG,
        parents=[common],
        description="Control the agentic-sandbox host supervisor (hostd). The socket is --socket, else "
        "$AIWG_HOSTD_SOCKET, else ./.run/hostd.sock if it exists, else " + PROD_SOCKET + ".",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(parent: Any, name: str, func: Callable[..., Awaitable[int]], help: str, **kw: Any) -> Any:
        p = parent.add_parser(name, parents=[common], help=help, description=kw.pop("description", help), **kw)
        p.set_defaults(func=func)
        return p

    command(sub, "status", cmd_status, "what hostd is and holds")
    command(sub, "instances", cmd_instances, "list instances")

    instance = sub.add_parser("instance", help="create, start, stop, destroy an instance").add_subparsers(
        dest="instance_command", required=True, metavar="ACTION"
    )
    p = command(
        instance,
        "create",
        cmd_instance_create,
        "provision a host instance; COMMAND is its supervised main process",
        usage=f"{PROG} instance create [options] NAME [-- COMMAND ...]",
    )
    p.add_argument("name")
    p.add_argument("--id", help="instance id (default: a new UUIDv7)")
    p.add_argument("--workdir", help="working directory (default: hostd's choice)")
    p.add_argument("--label", action="append", metavar="K=V")
    p.add_argument("--env", action="append", metavar="K=V")
    p.add_argument("--no-start", action="store_true", help="provision only")
    for name, func in (("start", cmd_instance_start), ("stop", cmd_instance_stop), ("destroy", cmd_instance_destroy)):
        p = command(instance, name, func, f"{name} an instance (by id or name)")
        p.add_argument("instance", metavar="ID")
        if name != "start":
            p.add_argument("--grace", type=float, help="seconds between SIGTERM and SIGKILL")

    session = sub.add_parser("session", help="create or delete a PTY session").add_subparsers(
        dest="session_command", required=True, metavar="ACTION"
    )
    p = command(
        session,
        "new",
        cmd_session_new,
        "start ARGV on a PTY session; prints its id",
        usage=f"{PROG} session new [options] -- ARGV ...",
    )
    p.add_argument("--instance", help=f"instance id or name (default: the one named {DEFAULT_INSTANCE_NAME!r})")
    p.add_argument("--id", help="session id (default: chosen by hostd)")
    p.add_argument("--cols", type=int, default=80)
    p.add_argument("--rows", type=int, default=24)
    p.add_argument("--cwd")
    p.add_argument("--env", action="append", metavar="K=V")
    p = command(session, "delete", cmd_session_delete, "kill (if running) and forget a session")
    p.add_argument("session_id", metavar="SID")

    p = command(sub, "sessions", cmd_sessions, "list PTY sessions")
    p.add_argument("--instance", help="only this instance (id or name)")

    p = command(sub, "logs", cmd_logs, "write a session's output (raw bytes) to stdout")
    p.add_argument("session_id", metavar="SID")
    p.add_argument("--from", dest="from_seq", type=int, metavar="N", help="first sequence (default: oldest held)")
    p.add_argument("--follow", "-f", action="store_true", help="keep streaming until the session exits")

    p = command(sub, "send", cmd_send, "type TEXT into a session")
    p.add_argument("session_id", metavar="SID")
    p.add_argument("text", metavar="TEXT")
    p.add_argument("--newline", "-n", action="store_true", help="then press Enter (sends CR)")

    p = command(sub, "kill", cmd_kill, "kill a session's process tree, or send it one signal")
    p.add_argument("session_id", metavar="SID")
    p.add_argument("--signal", "-s", metavar="NAME", help="send this signal (INT, SIGHUP, 9) instead of killing")
    p.add_argument("--grace", type=float, help="seconds between SIGTERM and SIGKILL")

    p = command(
        sub,
        "attach",
        cmd_attach,
        "attach this terminal to a session (detach: Ctrl-] or Ctrl-B d)",
        description=ATTACH_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("session_id", metavar="SID")
    p.add_argument("--from", dest="from_seq", type=int, metavar="N", help="start at sequence N")
    p.add_argument("--replay", action="store_true", help="replay what the ring holds, not from the last detach")
    p.add_argument(
        "--retries",
        type=int,
        default=len(RECONNECT_DELAYS_S),
        metavar="N",
        help=f"reconnect attempts after a lost connection (default {len(RECONNECT_DELAYS_S)}, about 8 s; 0: none)",
    )
    p.set_defaults(own_connection=True)
    return parser


# -- main ---------------------------------------------------------------------------------------


def _describe(exc: HostdError, socket_path: str) -> str:
    if isinstance(exc, HostdNotRunning):
        why = "no such socket" if not os.path.exists(socket_path) else "nothing listens on the socket"
        return f"hostd is not running at {socket_path} ({why})"
    if isinstance(exc, HostdConnectionLost):
        return f"lost the connection to hostd at {socket_path}: {exc}"
    if isinstance(exc, HostdUnavailable):
        return f"cannot reach hostd at {socket_path}: {exc}"
    if isinstance(exc, HostdTimeout):
        return f"hostd at {socket_path} did not answer in time: {exc}"
    if isinstance(exc, HostdVersionMismatch):
        return f"hostd at {socket_path} speaks another protocol version: {exc}"
    if isinstance(exc, HostdProtocolError):
        return f"protocol error talking to hostd at {socket_path}: {exc}"
    if isinstance(exc, HostdStreamOverflow):
        return f"output stream fell behind: {exc}"
    if isinstance(exc, HostdRemoteError):
        details = ", ".join(f"{k}={v}" for k, v in exc.details.items())
        return f"{exc.message} [{exc.code}]" + (f" ({details})" if details else "")
    return str(exc)


def _leaf(exc: BaseException) -> BaseException:
    """The error to report from what trio raised (nurseries wrap errors in groups)."""
    while isinstance(exc, BaseExceptionGroup):
        known = [e for e in exc.exceptions if isinstance(_leaf(e), (HostdError, UsageError, KeyboardInterrupt))]
        exc = known[0] if known else exc.exceptions[0]
    return exc


async def _run(args: argparse.Namespace) -> int:
    if getattr(args, "own_connection", False):
        return await args.func(None, args)
    async with open_hostd(args.socket, client_name=PROG) as client:
        return await args.func(client, args)


def _fail(message: str, status: int) -> NoReturn:
    print(f"{PROG}: {message}", file=sys.stderr)
    raise SystemExit(status)


#: Commands whose trailing ``-- ARGV ...`` is a command line to run, not more arguments.
_TRAILING_ARGV = (["instance", "create"], ["session", "new"])


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse, with everything after ``--`` taken as ``args.argv`` for the commands that run one.

    argparse cannot do this itself: a ``nargs="*"`` positional after options is matched
    (empty) as soon as the first positional is, so ``create NAME --id X -- CMD`` would fail.
    """
    trailing: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        head = argv[:cut]
        if any(head[i : i + 2] in _TRAILING_ARGV for i in range(len(head))):
            argv, trailing = head, argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    args.argv = trailing
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.socket = getattr(args, "socket", None) or default_socket()
    args.json = getattr(args, "json", False)
    try:
        return trio.run(_run, args)
    except BaseException as raised:  # sorted below; anything unknown re-raises
        exc = _leaf(raised)
        if isinstance(exc, HostdError):
            _fail(_describe(exc, args.socket), 1)
        if isinstance(exc, UsageError):
            _fail(str(exc), 2)
        if isinstance(exc, KeyboardInterrupt):
            return 130
        if isinstance(exc, BrokenPipeError):
            # stdout went away (`| head`); say nothing, like other filters.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        raise


if __name__ == "__main__":
    sys.exit(main())
