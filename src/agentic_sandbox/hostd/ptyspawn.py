"""The only module that opens PTYs and forks for them.

:func:`spawn_pty` starts ``argv`` on a new PTY through ptyprocess (fork, ``setsid`` so the
child leads its own session and process group, PTY as controlling terminal) and returns a
:class:`PtyChild` that owns three things: the master fd, a pidfd, and the duty to reap the
child.

Resource handling: ptyprocess's ``PtyProcess`` closes its fd and kills its child (sleeping
in between) when garbage-collected, whenever and in whichever thread that happens. We use a
subclass without that finalizer and keep nothing of the object: the master fd is duplicated
(close-on-exec), the object's own fd closed at once. When spawning fails after the fork, the
half-started child is killed and reaped and its fd closed before the error is raised.
:meth:`PtyChild.close` closes the master; :meth:`PtyChild.wait` reaps and closes the pidfd.

Error handling: every failure to start (argv[0] missing or not executable, cwd gone, cgroup
join refused, exec error) raises ``RpcError(SPAWN_FAILED)`` naming argv[0] and the OS error.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import shutil
import signal
import struct
import termios
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec
import ptyprocess
import trio

from agentic_sandbox.hostd.errors import RpcError
from agentic_sandbox.hostd.procspawn import FORKS, restore_signal_defaults
from agentic_sandbox.hostd.proctree import Cgroups
from agentic_sandbox.proto import ErrorCode

#: A read of at least this much is bulk output: a line discipline hands over at most 4 KiB a read, and
#: an echo or a prompt is far less.
BULK_BYTES = 2048
#: How long a worker-thread read polls before it returns to let a cancellation through.
_THREAD_POLL_MS = 100


class ExitStatus(msgspec.Struct, frozen=True):
    """How the child ended: ``exit_code`` for a normal exit, else the ``signal`` that killed it."""

    exit_code: int | None
    signal: int | None


def _resolve(argv0: str, cwd: str, env: Mapping[str, str]) -> str:
    """Find argv[0] the way the child would: relative paths against its cwd, bare names on
    its PATH (ptyprocess would search hostd's own PATH)."""
    if os.path.dirname(argv0):
        path = os.path.join(cwd, argv0)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        raise FileNotFoundError(errno.ENOENT, "no such executable file", argv0)
    found = shutil.which(argv0, path=env.get("PATH", os.defpath))
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "not found on PATH", argv0)
    return os.path.abspath(found)


def _check_exec_args(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Raise ValueError for what ``execve`` would refuse. ptyprocess execs in the forked child
    and does not catch a ValueError there: the child would go on running hostd's code."""
    for arg in argv:
        if "\0" in arg:
            raise ValueError(f"argument {arg[:80]!r} contains a NUL byte")
        os.fsencode(arg)
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"environment entry {key[:80]!r} is not valid")
        os.fsencode(key)
        os.fsencode(value)


def _preexec(cwd: str, join_cgroup: Callable[[], None] | None) -> Callable[[], None]:
    def preexec() -> None:
        # ptyprocess would chdir outside its error reporting: an exception there would leave
        # the forked child running hostd's code. Here a failure is reported and the child exits.
        os.chdir(cwd)
        restore_signal_defaults()
        if join_cgroup is not None:
            join_cgroup()

    return preexec


class PtyChild:
    """A process on a PTY. Created by :func:`spawn_pty` only; owns ``fd``, the pidfd and
    reaping ``pid``."""

    def __init__(self, pid: int, fd: int, pidfd: int) -> None:
        self.pid = pid
        self.fd = fd
        self._pidfd = pidfd
        self._write_lock = trio.Lock()
        self.closed = False
        self.status: ExitStatus | None = None
        #: The last read was bulk output: the next one goes to a worker thread.
        self._bulk = False

    def resize(self, cols: int, rows: int) -> None:
        """Set the window size; the kernel sends SIGWINCH to the foreground process group."""
        if self.closed:
            raise trio.ClosedResourceError("pty is closed")
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def window_size(self) -> tuple[int, int]:
        """(cols, rows) as the kernel holds them."""
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(self.fd, termios.TIOCGWINSZ, b"\0" * 8))
        return cols, rows

    async def read_some(self, max_bytes: int = 65536) -> bytes:
        """The next chunk of output; ``b""`` once every slave fd is closed (Linux reports that
        as EIO on the master, not as an empty read) or the master was closed.

        Cancellation never loses output: it is only delivered before a chunk was read.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while True:
            if self.closed:
                return b""
            try:
                data = os.read(self.fd, max_bytes)
            except BlockingIOError:
                try:
                    await trio.lowlevel.wait_readable(self.fd)
                except trio.ClosedResourceError:
                    return b""
                waited = True
                continue
            except OSError as exc:
                if exc.errno in (errno.EIO, errno.EBADF):
                    return b""
                raise
            if not waited:
                # Output was already there: a child writing flat out would otherwise keep its
                # reader from ever yielding. After a wait the reader has just been scheduled, and
                # a second pass through the scheduler would only delay a keystroke's echo.
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data

    async def read_chunk(self, max_bytes: int = 65536, limiter: trio.CapacityLimiter | None = None) -> bytes:
        """The next output; ``b""`` at the end. The session reader's call.

        Output that comes in bulk is read in a worker thread, gathered up to ``max_bytes``. On
        Linux a read or a poll that finds a PTY's line discipline empty while the child is still
        writing waits inside the kernel for the tty worker to hand the rest over (it flushes the
        tty's work), and a line discipline holds 4 KiB: on hostd's trio thread every read of a
        flooding PTY would stall all sessions and connections for as long as that worker takes
        to be scheduled, milliseconds on a busy host. Interactive output (a read under
        :data:`BULK_BYTES`) is read on the trio thread as it comes, with no hand-over to pay.
        ``limiter`` bounds the worker threads (trio's default limiter is shared with everything
        else hostd runs in threads).
        """
        if self._bulk:
            data = await self._read_in_thread(max_bytes, limiter)
            self._bulk = len(data) >= BULK_BYTES
            return data
        data = await self.read_some(max_bytes)
        self._bulk = len(data) >= BULK_BYTES
        return data

    async def _read_in_thread(self, max_bytes: int, limiter: trio.CapacityLimiter | None) -> bytes:
        while True:
            # Not abandoned on cancel: the thread returns within _THREAD_POLL_MS, so the fd is
            # never closed (and its number reused) under a read still in progress.
            data = await trio.to_thread.run_sync(self._read_blocking, max_bytes, limiter=limiter)
            if data is not None:
                return data

    def _read_blocking(self, max_bytes: int) -> bytes | None:
        """In a worker thread: wait for output (None after _THREAD_POLL_MS without any), then read
        what comes, up to ``max_bytes``, until the PTY has nothing more at once."""
        if self.closed:
            return b""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        if not poller.poll(_THREAD_POLL_MS):
            return None
        parts: list[bytes] = []
        size = 0
        while size < max_bytes and not self.closed:
            try:
                data = os.read(self.fd, max_bytes - size)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno in (errno.EIO, errno.EBADF):
                    break
                raise
            if not data:
                break
            parts.append(data)
            size += len(data)
        return b"".join(parts)

    def read_nowait(self, max_bytes: int = 65536) -> bytes:
        """What is buffered right now, without waiting; ``b""`` if nothing (or at the end)."""
        if self.closed:
            return b""
        try:
            return os.read(self.fd, max_bytes)
        except OSError:  # EAGAIN: nothing buffered; EIO: every slave closed
            return b""

    def write_nowait(self, data: bytes | memoryview) -> int:
        """Write what the PTY accepts right now; 0 if it is full or a write is in progress.

        Raises ``trio.BrokenResourceError`` if the child side is gone and
        ``ClosedResourceError`` if the master is closed.
        """
        if self.closed:
            raise trio.ClosedResourceError("pty is closed")
        if self._write_lock.locked():
            return 0  # keep order: a waiting writer goes first
        try:
            return os.write(self.fd, data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"pty write failed: {exc}") from exc

    async def write_all(self, data: bytes) -> int:
        """Write all of ``data`` to the child's input, waiting while the PTY buffer is full.

        Raises ``trio.BrokenResourceError`` if the child side is gone, ``ClosedResourceError``
        if the master is (or gets) closed meanwhile.
        """
        async with self._write_lock:
            view = memoryview(data)
            while view:
                if self.closed:
                    raise trio.ClosedResourceError("pty is closed")
                try:
                    n = os.write(self.fd, view)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self.fd)
                    continue
                except OSError as exc:
                    raise trio.BrokenResourceError(f"pty write failed: {exc}") from exc
                view = view[n:]
            await trio.lowlevel.checkpoint()
            return len(data)

    async def wait_writable(self) -> None:
        """Return once the PTY takes input again (or is closed: the next write says so)."""
        if self.closed:
            await trio.lowlevel.checkpoint()
            return
        try:
            await trio.lowlevel.wait_writable(self.fd)
        except trio.ClosedResourceError:
            pass

    @classmethod
    def adopt(cls, pid: int, fd: int, status: ExitStatus | None) -> PtyChild:
        """The PTY child an earlier image of hostd started (an upgrade in place: same pid, so still
        our child; or a hostd that crashed, :mod:`hostd.fdstore`: no longer our child, its exit
        status out of reach); ``status`` if it was reaped already."""
        os.set_inheritable(fd, False)
        os.set_blocking(fd, False)
        pidfd = -1 if status is not None else os.pidfd_open(pid)
        child = cls(pid, fd, pidfd)
        child.status = status
        return child

    async def wait_exited(self) -> None:
        """Return once the child has exited (it stays a zombie until :meth:`reap`)."""
        if self.status is not None:
            await trio.lowlevel.checkpoint()
            return
        await trio.lowlevel.wait_readable(self._pidfd)

    def reap(self) -> ExitStatus:
        """Collect the exit status of the exited child (after :meth:`wait_exited`)."""
        if self.status is None:
            try:
                _, raw = os.waitpid(self.pid, 0)
            except ChildProcessError:
                # Not our child: a session taken back after hostd crashed (hostd.fdstore). It has
                # ended (its pidfd said so), but how is gone with the hostd it was a child of.
                raw = None
            os.close(self._pidfd)
            self._pidfd = -1
            if raw is None:
                self.status = ExitStatus(None, None)
            else:
                code = os.waitstatus_to_exitcode(raw)
                self.status = ExitStatus(exit_code=code, signal=None) if code >= 0 else ExitStatus(None, -code)
        return self.status

    async def wait(self) -> ExitStatus:
        """Wait for the child to exit without blocking trio, reap it, return how it ended.

        Until the child is reaped its pid stays (at worst) a zombie, so neither the pid nor
        the pgid can be reused by another process: an owner that signals the tree holds off
        :meth:`reap` meanwhile by calling :meth:`wait_exited` and :meth:`reap` itself.
        """
        await self.wait_exited()
        return self.reap()

    @property
    def reaped(self) -> bool:
        return self.status is not None

    def close(self) -> None:
        """Close the master, waking any task waiting on it. Idempotent.

        A process still holding the slave gets a hangup. Reaping stays :meth:`wait`'s job.
        """
        if not self.closed:
            self.closed = True
            trio.lowlevel.notify_closing(self.fd)
            os.close(self.fd)


class _SpawnFailed(Exception):
    pass


_spawned = threading.local()


class _PtyProcess(ptyprocess.PtyProcess):
    """Remembers itself for the spawning thread (``spawn`` raises after constructing it when
    the child fails) and, unlike its base, does nothing when garbage-collected. Made in the
    parent right after the fork: the fork is over, so :data:`FORKS` is let go here, not once
    the child has run its pre-exec function and ``exec`` (which could hang on a dead mount)."""

    def __init__(self, pid: int, fd: int) -> None:
        _let_forks_go()
        super().__init__(pid, fd)
        _spawned.proc = self

    def __del__(self) -> None:
        pass


def _let_forks_go() -> None:
    """Release :data:`FORKS` if this thread's spawn holds it (once: after the fork, or on failure)."""
    if getattr(_spawned, "forking", False):
        _spawned.forking = False
        FORKS.release()


def _discard(proc: ptyprocess.PtyProcess) -> None:
    """Close a failed spawn's fd and kill and reap its child (it may have exec'd already)."""
    proc.closed = True
    with contextlib.suppress(OSError):
        proc.fileobj.close()
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(proc.pid, 0)


def _spawn_blocking(
    argv: Sequence[str], cwd: str, env: dict[str, str], cols: int, rows: int, cgroup: Path | None
) -> PtyChild:
    _spawned.proc = None
    try:
        _check_exec_args(argv, env)
        executable = _resolve(argv[0], cwd, env)
        # Never while hostd stands in an exec's cgroup (see hostd.procspawn.born_in): held
        # for the fork only (_PtyProcess lets it go).
        FORKS.acquire()
        _spawned.forking = True
        try:
            proc = _PtyProcess.spawn(
                [executable, *argv[1:]],
                cwd=None,
                env=env,
                dimensions=(rows, cols),
                preexec_fn=_preexec(cwd, Cgroups.join_fn(cgroup)),
            )
        finally:
            _let_forks_go()  # the fork itself failed
        pidfd = os.pidfd_open(proc.pid)
    except Exception as exc:
        failed, _spawned.proc = _spawned.proc, None
        if failed is not None:
            _discard(failed)
        # ptyprocess re-raises the child's preexec/exec error as the builtin type it had.
        message = str(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
        raise _SpawnFailed(message) from None
    _spawned.proc = None
    try:
        fd = os.dup(proc.fd)  # non-inheritable, unlike forkpty's master
    except OSError as exc:
        os.close(pidfd)
        _discard(proc)
        raise _SpawnFailed(str(exc)) from None
    proc.fileobj.close()
    proc.closed = True
    os.set_blocking(fd, False)
    return PtyChild(proc.pid, fd, pidfd)


async def spawn_pty(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    cols: int = 80,
    rows: int = 24,
    cgroup: Path | None = None,
) -> PtyChild:
    """Start ``argv`` on a new PTY in ``cwd`` with exactly ``env``; join ``cgroup`` before exec.

    The child's argv[0] is the resolved path of ``argv[0]``. The fork and the wait for exec
    run in a worker thread (the parent blocks until exec) and are not cancellable: a started
    child is always handed back to be owned.
    """
    try:
        return await trio.to_thread.run_sync(_spawn_blocking, list(argv), cwd, dict(env), cols, rows, cgroup)
    except _SpawnFailed as exc:
        raise RpcError(ErrorCode.SPAWN_FAILED, f"cannot start {argv[0]!r}: {exc}", argv0=argv[0]) from None
