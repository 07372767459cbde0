"""A stand-in for systemd as the service manager of one ``Type=notify`` service, for crash tests.

It speaks the real protocols, so code that passes here works unchanged under systemd:

* sd_notify(3): an AF_UNIX datagram socket with SO_PASSCRED (every message carries the sender's
  pid, as systemd requires); ``KEY=VALUE`` lines, recorded in arrival order in :attr:`history`;
* the file descriptor store: ``FDSTORE=1`` keeps the fds sent with it under ``FDNAME=`` (default
  "stored"), at most ``fd_store_max`` (``FileDescriptorStoreMax=``) of them, an fd it already
  holds once; ``FDSTOREREMOVE=1`` closes a name's fds; a stored fd that reports POLLHUP/POLLERR is
  dropped unless it came with ``FDPOLL=0``; fds sent without ``FDSTORE=1`` are closed;
* sd_listen_fds(3): :meth:`ServiceManager.start` passes the stored fds at 3, 4, ... in store order
  with ``LISTEN_FDS``, ``LISTEN_FDNAMES`` and ``LISTEN_PID``, the started program's own pid.

``NotifyAccess=all`` by default; with ``notify_access="main"``, messages from other pids than the
running service's are ignored (with no service running, all are taken, so a test can fill the
store before the first start). Closing the manager kills a service still running (SIGKILL, the
main process only) and closes every stored fd.
"""

from __future__ import annotations

import array
import fcntl
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal

import trio

log = logging.getLogger(__name__)

#: sd_notify's buffer (systemd's NOTIFY_BUFFER_MAX): a longer message is refused.
NOTIFY_BUFFER_MAX = 4096
SCM_MAX_FD = 253
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
# fcntl(a, F_DUPFD_QUERY, b) (Linux 6.10): 1 if a and b are the same open file. Not in Python's fcntl.
F_DUPFD_QUERY = 1024 + 3
#: The private variable the start shim takes the fds' numbers from.
_SHIM_FDS = "_SERVICE_MANAGER_FDS"
# Between fork and exec systemd moves the fds to 3, 4, ... and sets LISTEN_PID to the pid the
# program will have. The shim does both in the child before it execs the program (same pid):
# the parent passes the fds above 3 + n, so no dup2 overwrites a source yet to be moved.
_SHIM = f"""
import os, sys
sources = [int(fd) for fd in os.environ.pop({_SHIM_FDS!r}).split(",")]
for target, fd in enumerate(sources, 3):
    os.dup2(fd, target)  # inheritable, like the fds systemd passes
for fd in sources:
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.execvp(sys.argv[1], sys.argv[1:])
"""
#: What systemd sets for one service only: never inherited from the test's environment.
_MANAGER_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def same_file(a: int, b: int) -> bool:
    """Whether fds ``a`` and ``b`` are one open file, as systemd's same_fd decides it."""
    try:
        return fcntl.fcntl(a, F_DUPFD_QUERY, b) > 0
    except OSError:
        pass  # a kernel before 6.10; systemd's fallback without kcmp:
    sa, sb = os.fstat(a), os.fstat(b)
    if (sa.st_dev, sa.st_ino) != (sb.st_dev, sb.st_ino):
        return False
    # Two fds of one device may be quite different device contexts.
    if sa.st_mode & 0o170000 in (0o020000, 0o060000):
        return False
    # The read and write end of a pipe share the inode, not the access mode.
    mask = os.O_ACCMODE | os.O_NONBLOCK
    return fcntl.fcntl(a, fcntl.F_GETFL) & mask == fcntl.fcntl(b, fcntl.F_GETFL) & mask


class ServiceManager:
    """``async with ServiceManager(tmp_path) as sm:``, then :meth:`start` the service."""

    def __init__(
        self, directory: Path, *, fd_store_max: int = 1024, notify_access: Literal["all", "main"] = "all"
    ) -> None:
        self.directory = directory
        self.fd_store_max = fd_store_max
        self.notify_access = notify_access
        self.log_path = directory / "service.log"
        #: Every assignment received, in order (``READY=1``, ``STATUS=...``, ``FDSTORE=1``, ...).
        self.history: list[str] = []
        #: Fds refused (over ``fd_store_max``, or sent without ``FDSTORE=1``) and closed.
        self.refused = 0
        #: The service from the last :meth:`start`.
        self.process: trio.Process | None = None
        self._store: list[tuple[str, int]] = []
        self._polled: set[int] = set()
        self._epoll = select.epoll()
        self._changed = trio.Event()
        self._sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._address = str(directory / "notify.sock")
        self._nursery: trio.Nursery | None = None

    @property
    def notify_socket(self) -> str:
        """The NOTIFY_SOCKET value that points at this manager."""
        return self._address if self._address.startswith("/") else "@" + self._address[1:]

    @property
    def env(self) -> dict[str, str]:
        return {"NOTIFY_SOCKET": self.notify_socket}

    async def __aenter__(self) -> ServiceManager:
        if len(os.fsencode(self._address)) >= 108:  # sun_path: fall back to an abstract name
            self._address = f"\0aiwg-service-manager-{os.getpid()}-{os.urandom(4).hex()}"
        # Without SO_PASSCRED no credentials come with a message, and systemd ignores such messages.
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        await self._sock.bind(self._address)
        self._nursery_manager = trio.open_nursery()
        self._nursery = await self._nursery_manager.__aenter__()
        self._nursery.start_soon(self._receive)
        self._nursery.start_soon(self._poll_store)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        try:
            with trio.CancelScope(shield=True):
                if self.process is not None and self.process.returncode is None:
                    self.process.kill()
                    with trio.move_on_after(10):
                        await self.process.wait()
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()
            return await self._nursery_manager.__aexit__(exc_type, exc, tb)
        finally:
            for _, fd in self._store:
                os.close(fd)
            self._store.clear()
            self._epoll.close()
            self._sock.close()
            if self._address.startswith("/"):
                Path(self._address).unlink(missing_ok=True)

    # -- what the tests look at

    def stored(self) -> dict[str, int]:
        """How many fds the store holds, by name."""
        counts: dict[str, int] = {}
        for name, _ in self._store:
            counts[name] = counts.get(name, 0) + 1
        return counts

    def mark(self) -> int:
        """The current end of :attr:`history`, for :meth:`wait_for` ``since``."""
        return len(self.history)

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Until ``condition()`` holds, checked after every message and store change; bound it."""
        while not condition():
            await self._changed.wait()

    async def wait_for(self, assignment: str, *, since: int = 0) -> int:
        """Until ``assignment`` (``"READY=1"``) is in :attr:`history` at ``since`` or later; its index.

        Everything of the message it came in has been handled by then (fds stored, removed).
        """
        while True:
            try:
                return self.history.index(assignment, since)
            except ValueError:
                await self._changed.wait()

    # -- the service

    async def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> trio.Process:
        """Start the service as systemd would, the stored fds at 3, 4, ...; output to :attr:`log_path`."""
        if self.process is not None and self.process.returncode is None:
            raise RuntimeError(f"the service is still running (pid {self.process.pid})")
        child_env = {k: v for k, v in (os.environ if env is None else env).items() if k not in _MANAGER_VARS}
        child_env["NOTIFY_SOCKET"] = self.notify_socket
        count = len(self._store)
        # Copies above 3 + count (see _SHIM), closed here once the child has its own.
        sources = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3 + count) for _, fd in self._store]
        if sources:
            child_env["LISTEN_FDS"] = str(count)
            child_env["LISTEN_FDNAMES"] = ":".join(name for name, _ in self._store)
            child_env[_SHIM_FDS] = ",".join(map(str, sources))
            argv = [sys.executable, "-I", "-S", "-c", _SHIM, *argv]
        try:
            with self.log_path.open("ab") as out:
                self.process = await trio.lowlevel.open_process(
                    list(argv), env=child_env, pass_fds=sources, stdin=subprocess.DEVNULL, stdout=out, stderr=out
                )
        finally:
            for fd in sources:
                os.close(fd)
        return self.process

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the service's main process."""
        assert self.process is not None, "no service started"
        self.process.send_signal(sig)

    async def wait_exit(self) -> int:
        """Until the service's main process exited; its return code. Bound it."""
        assert self.process is not None, "no service started"
        return await self.process.wait()

    # -- the notify socket

    async def _receive(self) -> None:
        ancillary = socket.CMSG_SPACE(SCM_MAX_FD * 4) + socket.CMSG_SPACE(_UCRED.size)
        while True:
            data, ancdata, flags, _ = await self._sock.recvmsg(NOTIFY_BUFFER_MAX, ancillary, socket.MSG_CMSG_CLOEXEC)
            fds: list[int] = []
            pid: int | None = None
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds += array.array("i", payload[: len(payload) - len(payload) % 4])
                elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _UCRED.unpack_from(payload)[0]
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                log.warning("notification truncated, ignoring it")
                self._refuse(fds)
            elif pid is None:
                log.warning("notification without credentials, ignoring it")
                self._refuse(fds)
            elif self._ignored(pid):
                log.warning("notification from pid %d, not the main pid, ignoring it", pid)
                self._refuse(fds)
            else:
                self._handle(data.decode(errors="replace").split("\n"), fds)
            self._notify_waiters()

    def _ignored(self, pid: int) -> bool:
        if self.notify_access == "all" or self.process is None or self.process.returncode is not None:
            return False
        return pid != self.process.pid

    def _handle(self, lines: list[str], fds: list[int]) -> None:
        assignments = [line for line in lines if "=" in line]
        values = dict(line.split("=", 1) for line in assignments)
        name = values.get("FDNAME")
        if name is not None and not _valid_fdname(name):
            log.warning("invalid FDNAME=%r, ignoring it", name)
            name = None
        if values.get("FDSTORE") == "1":
            self._add("stored" if name is None else name, fds, poll=values.get("FDPOLL") != "0")
        elif fds:
            log.warning("%d fds sent without FDSTORE=1, closing them", len(fds))
            self._refuse(fds)
        if values.get("FDSTOREREMOVE") == "1":
            if name is None:
                log.warning("FDSTOREREMOVE=1 without FDNAME=, ignoring it")
            else:
                self._remove(lambda n, _: n == name)
        self.history += assignments

    # -- the fd store

    def _add(self, name: str, fds: list[int], *, poll: bool) -> None:
        for fd in fds:
            if any(same_file(fd, kept) for _, kept in self._store):
                os.close(fd)  # systemd keeps one copy of an open file
            elif len(self._store) >= self.fd_store_max:
                log.warning("fd store full (FileDescriptorStoreMax=%d), closing an fd", self.fd_store_max)
                self._refuse([fd])
            else:
                self._store.append((name, fd))
                if poll:
                    try:
                        self._epoll.register(fd, 0)  # no events asked: only POLLHUP and POLLERR come
                        self._polled.add(fd)
                    except PermissionError:
                        pass  # a regular file cannot be polled, and never hangs up

    def _remove(self, match: Callable[[str, int], bool]) -> None:
        keep = []
        for name, fd in self._store:
            if match(name, fd):
                if fd in self._polled:
                    self._polled.discard(fd)
                    self._epoll.unregister(fd)
                os.close(fd)
            else:
                keep.append((name, fd))
        self._store = keep

    def _refuse(self, fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)
        self.refused += len(fds)

    async def _poll_store(self) -> None:
        # The epoll fd turns readable when a stored fd hangs up: systemd drops such an fd.
        while True:
            await trio.lowlevel.wait_readable(self._epoll.fileno())
            gone = {fd for fd, _ in self._epoll.poll(0)}
            self._remove(lambda _, fd, gone=gone: fd in gone)
            self._notify_waiters()

    def _notify_waiters(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


def _valid_fdname(name: str) -> bool:
    # systemd's fdname_is_valid, which lets the empty name through.
    return len(name) <= 255 and all(" " <= ch <= "~" and ch != ":" for ch in name)
