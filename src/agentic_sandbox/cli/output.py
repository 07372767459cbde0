"""What ``agentic-hostctl`` prints: JSON, tables, and one line on stderr for each failure.

Results go to stdout: with ``--json`` the response structs as indented JSON (without the wire
tag and request id), else aligned tables or one line per object. Failures go to stderr as one
line starting with the program name and never as a traceback (:func:`exit_status`): a
``HostdError`` exits 1, a :class:`UsageError` exits 2 (argparse's convention for usage errors),
Ctrl-C exits 130, and a closed stdout (``| head``) ends quietly with 0. Anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import msgspec

from agentic_sandbox.proto import (
    HostdConnectionLost,
    HostdError,
    HostdNotRunning,
    HostdProtocolError,
    HostdRemoteError,
    HostdStreamOverflow,
    HostdTimeout,
    HostdUnavailable,
    HostdVersionMismatch,
)
from agentic_sandbox.proto import messages as m

PROG = "agentic-hostctl"


class UsageError(Exception):
    """The command line asks for something that cannot work; exit status 2."""


# -- results ------------------------------------------------------------------------------------


def plain(obj: Any) -> Any:
    """Builtins for JSON output, without the wire-only tag and request id."""
    data = msgspec.to_builtins(obj)
    if isinstance(data, dict):
        data.pop("t", None)
        data.pop("id", None)
    return data


def print_json(obj: Any) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(plain(obj)), indent=2).decode() + "\n")


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    for row in [headers, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def opt(value: object) -> str:
    return "-" if value is None else str(value)


def exit_text(exit_code: int | None, signum: int | None) -> str:
    if signum:
        return f"killed by signal {signum}"
    return f"exited with code {exit_code}"


def print_status(resp: m.StatusResponse, as_json: bool) -> None:
    if as_json:
        print_json(resp)
    else:
        for key, value in plain(resp).items():
            print(f"{key + ':':<18} {opt(value)}")


def print_instance(info: m.InstanceInfo, as_json: bool) -> None:
    if as_json:
        print_json(info)
    else:
        print(f"{info.instance_id} {_state(info)}" + (f" ({info.note})" if info.note else ""))


def _state(info: m.InstanceInfo) -> str:
    """The state; a sleeping instance's says how (``sleeping/freeze``)."""
    return f"sleeping/{info.sleep.how}" if info.state == "sleeping" and info.sleep is not None else info.state


def print_instances(infos: list[m.InstanceInfo], as_json: bool) -> None:
    if as_json:
        print_json(infos)
        return
    rows = [
        [
            i.instance_id,
            i.name,
            f"{i.runtime}/{i.provider}",
            _state(i),
            opt(i.host.pid if i.host else None),
            str(i.sessions),
            str(i.execs),
            i.working_dir,
        ]
        for i in infos
    ]
    print_table(["INSTANCE", "NAME", "RUNTIME", "STATE", "PID", "SESSIONS", "EXECS", "WORKDIR"], rows)


def print_pools(pools: list[m.PoolInfo], as_json: bool) -> None:
    if as_json:
        print_json(pools)
        return
    rows = [
        [
            p.pool,
            f"{p.runtime}/{p.provider}",
            p.source,
            f"{p.ready}/{p.size}",
            str(p.filling),
            str(p.hits),
            str(p.misses),
            p.last_error or "-",
        ]
        for p in pools
    ]
    print_table(["POOL", "RUNTIME", "SOURCE", "READY", "FILLING", "HITS", "MISSES", "LAST ERROR"], rows)


def print_sessions(sessions: list[m.SessionInfo], as_json: bool) -> None:
    if as_json:
        print_json(sessions)
        return
    rows = [
        [
            s.session_id,
            s.instance_id,
            "pending" if s.pending else s.state if s.state == "running" else exit_text(s.exit_code, s.signal),
            opt(s.pid),
            f"{s.first_seq}-{s.next_seq - 1}" if s.next_seq > s.first_seq else "-",
            " ".join(s.argv),
        ]
        for s in sessions
    ]
    print_table(["SESSION", "INSTANCE", "STATE", "PID", "SEQ", "COMMAND"], rows)


# -- failures -----------------------------------------------------------------------------------


def describe_error(exc: HostdError, socket_path: str) -> str:
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


def leaf_error(exc: BaseException) -> BaseException:
    """The error to report from what trio raised (nurseries wrap errors in groups)."""
    while isinstance(exc, BaseExceptionGroup):
        known = [e for e in exc.exceptions if isinstance(leaf_error(e), (HostdError, UsageError, KeyboardInterrupt))]
        exc = known[0] if known else exc.exceptions[0]
    return exc


def fail(message: str, status: int) -> NoReturn:
    print(f"{PROG}: {message}", file=sys.stderr)
    raise SystemExit(status)


def exit_status(raised: BaseException, socket_path: str) -> int:
    """Report what ended a command on stderr and return (or exit with) its status.

    Called while handling ``raised``; anything not expected is re-raised for its traceback.
    """
    exc = leaf_error(raised)
    if isinstance(exc, HostdError):
        fail(describe_error(exc, socket_path), 1)
    if isinstance(exc, UsageError):
        fail(str(exc), 2)
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, BrokenPipeError):
        # stdout went away (`| head`); say nothing, like other filters.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    raise raised
