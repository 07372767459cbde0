"""sd_notify(3) without libsystemd: tell the service manager we are ready, alive, stopping.

The protocol is one datagram of ``KEY=VALUE`` lines to the AF_UNIX socket named in
``NOTIFY_SOCKET`` (a path, or an abstract name written with a leading ``@``). Without
``NOTIFY_SOCKET`` (not started by systemd, or ``Type=`` is not notify) every function here is
a no-op that returns False, so hostd runs the same under systemd, in a terminal and in tests.

Error handling: a notification that cannot be delivered is logged and reported as False,
never raised. Sends use ``MSG_DONTWAIT`` so a full socket queue never blocks trio's loop.

Children must not inherit ``NOTIFY_SOCKET``/``WATCHDOG_*`` (an agent could otherwise speak for
hostd); spawners drop the names in :data:`SYSTEMD_ENV_VARS` from the environments they build.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

import trio

log = logging.getLogger(__name__)

#: Variables systemd hands to the main process only; never pass them on to children.
SYSTEMD_ENV_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


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
