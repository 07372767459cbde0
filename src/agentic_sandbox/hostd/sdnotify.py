"""sd_notify(3) without libsystemd: tell the service manager we are ready, alive, stopping.

The protocol is one datagram of ``KEY=VALUE`` lines to the AF_UNIX socket named in
``NOTIFY_SOCKET`` (a path, or an abstract name written with a leading ``@``). Without
``NOTIFY_SOCKET`` (not started by systemd, or ``Type=`` is not notify) every function here is
a no-op that returns False, so hostd runs the same under systemd, in a terminal and in tests.

Error handling: a notification that cannot be delivered is logged and reported as False,
never raised. Sends use ``MSG_DONTWAIT`` so a full socket queue never blocks trio's loop.

Children must not inherit ``NOTIFY_SOCKET``/``WATCHDOG_*`` (an agent could otherwise speak for
hostd); spawners drop the names in :data:`SYSTEMD_ENV_VARS` from the environments they build.

The file descriptor store (:func:`store_fds`, :func:`remove_fds`) keeps fds in systemd across a
crash of hostd: systemd hands them back at the next start (``LISTEN_FDS``, read with
:func:`hostd.listenfds.take_listen_fds`). Ownership: :func:`store_fds` sends copies, the caller
keeps and still closes its own fds. systemd drops a stored fd by itself once it reports
POLLHUP/POLLERR (the other end of a pipe or socket closed), and the unit needs
``FileDescriptorStoreMax=`` above 0, or every fd sent is closed. A bad FDNAME is the caller's bug
and raises ValueError; delivery failures are logged and reported as False like :func:`notify`.
"""

from __future__ import annotations

import array
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence

import trio

log = logging.getLogger(__name__)

#: Variables systemd hands to the main process only; never pass them on to children.
SYSTEMD_ENV_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")

#: The longest FDNAME systemd accepts (FDNAME_MAX).
FDNAME_MAX = 255
#: The most fds the kernel passes in one SCM_RIGHTS message (SCM_MAX_FD).
SCM_MAX_FD = 253


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def socket_address(env: Mapping[str, str] | None = None) -> str | None:
    """The address to send to: a path, or an abstract name starting with NUL; None if unset."""
    raw = _env(env).get("NOTIFY_SOCKET", "")
    if not raw:
        return None
    if raw.startswith("@"):
        # Linux abstract namespace: systemd writes the leading NUL as '@'.
        return "\0" + raw[1:]
    if not raw.startswith("/"):
        log.warning("ignoring NOTIFY_SOCKET=%r: neither an absolute path nor an abstract name", raw)
        return None
    return raw


def notify(state: str, *, env: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (newline-separated ``KEY=VALUE`` assignments). True if it was delivered."""
    address = socket_address(env)
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.send(state.encode(), socket.MSG_DONTWAIT)
    except OSError as exc:
        log.warning("sd_notify %r to %r failed: %s", state.split("\n", 1)[0], address, exc)
        return False
    return True


def _send(state: str, fds: Sequence[int], env: Mapping[str, str] | None) -> bool:
    """Like :func:`notify`, with ``fds`` attached as SCM_RIGHTS (none: a plain datagram)."""
    address = socket_address(env)
    if address is None:
        return False
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendmsg([state.encode()], ancillary, socket.MSG_DONTWAIT)
    except OSError as exc:
        log.warning("sd_notify %r with %d fds to %r failed: %s", state.replace("\n", " "), len(fds), address, exc)
        return False
    return True


def check_fdname(name: str) -> None:
    """Raise ValueError unless systemd takes ``name`` as FDNAME (fdname_is_valid, and not empty).

    systemd ignores an invalid name (the fds would be stored as "stored" instead) and it is a
    field of the colon-separated ``LISTEN_FDNAMES``, hence: printable ASCII, no ':'.
    """
    if not 1 <= len(name) <= FDNAME_MAX:
        raise ValueError(f"FDNAME must have 1 to {FDNAME_MAX} characters, not {len(name)}")
    if any(not " " <= ch <= "~" or ch == ":" for ch in name):
        raise ValueError(f"FDNAME {name!r} must be printable ASCII without ':'")


def store_fds(name: str, fds: Sequence[int], *, env: Mapping[str, str] | None = None) -> bool:
    """FDSTORE=1: keep copies of ``fds`` in systemd under ``name`` (systemd's sd_pid_notify_with_fds).

    One datagram, so all of them or none are stored; storing an fd systemd already holds keeps one
    copy. The fds come back at the next start in the order they were stored.
    """
    check_fdname(name)
    if len(fds) > SCM_MAX_FD:
        raise ValueError(f"at most {SCM_MAX_FD} fds fit in one message, not {len(fds)}")
    return _send(f"FDSTORE=1\nFDNAME={name}", fds, env)


def remove_fds(name: str, *, env: Mapping[str, str] | None = None) -> bool:
    """FDSTOREREMOVE=1: systemd closes every fd it stores under ``name``."""
    check_fdname(name)
    return _send(f"FDSTOREREMOVE=1\nFDNAME={name}", (), env)


def reloading(*, env: Mapping[str, str] | None = None) -> bool:
    """RELOADING=1 with the MONOTONIC_USEC that ``Type=notify-reload`` asks for (sd_notify(3)).

    The reload is over once :func:`ready` is sent again.
    """
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify(f"RELOADING=1\nMONOTONIC_USEC={usec}", env=env)


def _one_line(text: str) -> str:
    # A newline would start a new assignment inside the datagram.
    return " ".join(text.splitlines())


def ready(status_text: str | None = None, *, env: Mapping[str, str] | None = None) -> bool:
    """READY=1: hostd listens and answers; systemd starts units ordered after us."""
    state = "READY=1"
    if status_text:
        state += f"\nSTATUS={_one_line(status_text)}"
    return notify(state, env=env)


def stopping(*, env: Mapping[str, str] | None = None) -> bool:
    """STOPPING=1: a clean shutdown has begun."""
    return notify("STOPPING=1", env=env)


def watchdog(*, env: Mapping[str, str] | None = None) -> bool:
    """WATCHDOG=1: one keep-alive ping."""
    return notify("WATCHDOG=1", env=env)


def status(text: str, *, env: Mapping[str, str] | None = None) -> bool:
    """STATUS=...: the one-line status `systemctl status` shows."""
    return notify(f"STATUS={_one_line(text)}", env=env)


def watchdog_interval_s(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between pings (half of WATCHDOG_USEC), or None if the watchdog is not for us.

    Like sd_watchdog_enabled(3): WATCHDOG_PID, when set, must be our pid, since a child that
    inherited the variables must not think the watchdog is its own.
    """
    env = _env(env)
    raw_usec = env.get("WATCHDOG_USEC", "")
    raw_pid = env.get("WATCHDOG_PID", "")
    if not raw_usec:
        return None
    try:
        usec = int(raw_usec)
        pid = int(raw_pid) if raw_pid else None
    except ValueError:
        log.warning("ignoring malformed WATCHDOG_USEC=%r WATCHDOG_PID=%r", raw_usec, raw_pid)
        return None
    if usec <= 0 or (pid is not None and pid != os.getpid()):
        return None
    return usec / 2 / 1_000_000


async def run_watchdog(
    *,
    env: Mapping[str, str] | None = None,
    task_status: trio.TaskStatus[float | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Ping the watchdog every :func:`watchdog_interval_s` until cancelled.

    Start it with ``await nursery.start(run_watchdog)``; it reports the interval (None when
    there is no watchdog or no NOTIFY_SOCKET, in which case it returns at once). Pings come
    from trio's loop, so a wedged loop stops them and systemd restarts hostd: that is the point.
    """
    interval = watchdog_interval_s(env)
    if interval is None or socket_address(env) is None:
        task_status.started(None)
        return
    task_status.started(interval)
    while True:
        watchdog(env=env)
        await trio.sleep(interval)
