"""The one place hostd starts pipe-based processes (instance main processes, execs).

Every process started here is the leader of a new tree, marked the three ways
:mod:`hostd.proctree` relies on to kill it whole:

* ``start_new_session=True``: the child calls ``setsid``, so ``pgid == pid``;
* ``AIWG_TREE=<tree id>`` in its environment, inherited by every descendant;
* its own cgroup (from :meth:`Cgroups.create`, when there is one), which it is born in: hostd
  steps into that cgroup itself for the moment of the start (:func:`born_in`: the child of a
  process is created in the cgroup its parent is in), then back into its own. So the program
  is in its cgroup from its first instruction, with whatever it starts, and no second program
  has to run first to move it there (a shell that joins, then ``exec``s the program, cost
  0.6 ms of latency and of CPU per start on the machine this was measured on). Each move waits
  for the kernel (cgroup migration synchronises with RCU: about 0.09 ms there, little CPU), so
  hostd's loop is held about 0.2 ms longer per start than by the spawn alone. hostd's other
  threads are in that cgroup for the moment too: none of them starts processes but the PTY
  spawns, which fork in a worker thread and so take turns with it (:data:`FORKS`); nothing kills
  a cgroup but the event loop's thread, which is busy starting the child meanwhile; and
  :mod:`hostd.proctree` never signals hostd's own pid.

Why not a pre-exec function that joins: with any ``preexec_fn`` CPython must ``fork`` (copying
hostd's page tables, then running Python in the child), which costs milliseconds of CPU and, on a
loaded host, tens of milliseconds of latency per start; without one it uses ``vfork``, and the
child only runs C code until ``exec``. The rest of what a pre-exec function would do is done
without one: the child starts with every signal at its default action and none blocked. Handlers
are reset by ``exec``; ``restore_signals`` resets the two Python ignores (SIGPIPE, SIGXFSZ); any
other signal hostd ignores (inherited from ``nohup`` or a background job) is caught by a no-op
handler instead before each start (:func:`no_ignored_signals`: hostd still does not react to it,
and the child gets the default), except SIGTTOU and SIGTTIN (see :data:`_TTY_STOPS`); the
blocked mask is the spawning thread's, which hostd keeps empty (:func:`unblock_signals` at
start).

Started on the event loop's thread, not in a worker thread as ``trio.lowlevel.open_process``
does it: with ``vfork`` the loop waits only until the child's ``exec`` (0.1 ms on an idle
machine, 0.2 ms under the A2A benchmark's load), which costs less than the two thread switches
and the GIL handoffs of a worker thread (0.14 ms less of hostd's CPU per exec, 0.27 ms less per
A2A task, measured with ``bench/bench_a2a.py``); asyncio starts its children the same way. It
also keeps the moment hostd spends in a child's cgroup on the one thread that kills cgroups. The
returned :class:`Process` is what hostd used of ``trio.Process``.

File descriptors: ``close_fds=True``; only ``pass_fds`` (the control channel) crosses into the
child, at the same fd number. The caller owns the trio streams of the returned process and must
close them; the child's ends of pipes are closed here.

Waiting: :func:`wait_exit` for our own children (exit code known), :func:`wait_pid_exit` for a
process hostd did not start in this run (re-adopted after a restart; exit code only if it
happens to be our child).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import trio

from agentic_sandbox.proto import ErrorCode

from .errors import RpcError
from .proctree import TREE_ENV, move_self, own_cgroup

log = logging.getLogger(__name__)

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT


class Process:
    """A child :func:`spawn` started (or an earlier image of hostd started, :meth:`adopt`): its pid,
    its pipes (trio streams, or None) and its exit, waited for on a pidfd."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes] | None,
        stdin: trio.lowlevel.FdStream | None,
        stdout: trio.lowlevel.FdStream | None,
        stderr: trio.lowlevel.FdStream | None,
        *,
        pid: int | None = None,
        returncode: int | None = None,
    ) -> None:
        #: Kept while the child runs: a Popen collected unreaped would be reaped by subprocess's
        #: own clean-up at the next start, its exit status lost to us.
        self._popen = popen
        self.pid = popen.pid if popen is not None else pid if pid is not None else -1
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._returncode = returncode
        # Our child, not reaped yet: its pid cannot be another process's.
        self._pidfd: int | None = os.pidfd_open(self.pid) if returncode is None else None
        self._wait_lock = trio.Lock()

    @classmethod
    def adopt(
        cls, pid: int, stdin: int | None, stdout: int | None, stderr: int | None, returncode: int | None
    ) -> Process:
        """A child an earlier image of hostd started (an upgrade in place keeps the pid, so it is
        still our child), with the fds of its pipes; ``returncode`` if that image reaped it."""

        def stream(fd: int | None) -> trio.lowlevel.FdStream | None:
            if fd is None:
                return None
            os.set_inheritable(fd, False)
            return trio.lowlevel.FdStream(fd)

        return cls(None, stream(stdin), stream(stdout), stream(stderr), pid=pid, returncode=returncode)

    @property
    def returncode(self) -> int | None:
        """The return code (negative: the signal) once the child has exited, else None; reaps it
        (as ``trio.Process.returncode`` does)."""
        return self.poll()

    def poll(self) -> int | None:
        if self._returncode is None:
            if self._popen is not None:
                self._returncode = self._popen.poll()
            else:
                try:
                    pid, raw = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped by someone else: its status is gone
                    pid, raw = self.pid, 255 << 8
                if pid:
                    self._returncode = os.waitstatus_to_exitcode(raw)
            if self._returncode is not None:
                self._close_pidfd()
        return self._returncode

    async def wait_exited(self) -> None:
        """Return once the child has exited, without reaping it."""
        if self._pidfd is None:
            await trio.lowlevel.checkpoint()
            return
        with contextlib.suppress(trio.ClosedResourceError):  # reaped by poll() meanwhile
            await trio.lowlevel.wait_readable(self._pidfd)

    async def wait(self) -> int:
        """Wait for the child to exit and reap it; its return code (negative: the signal)."""
        async with self._wait_lock:
            if self.poll() is None:
                await self.wait_exited()
                if self._popen is not None:
                    self._popen.wait()
                    self.poll()
                else:
                    while self.poll() is None:  # readable pidfd: the exit is there to collect
                        await trio.sleep(0.001)
        code = self._returncode
        assert code is not None
        return code

    def send_signal(self, sig: int) -> None:
        """Signal the child unless it was reaped already (then its pid may be another's)."""
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            trio.lowlevel.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def __del__(self) -> None:
        # A child left to run on (hostd stopping: its successor re-adopts it by pid) keeps no fd here.
        if self._pidfd is not None:
            os.close(self._pidfd)


def _pipe(stdio: int | None, *, to_child: bool) -> tuple[trio.lowlevel.FdStream | None, int | None, int | None]:
    """(our trio stream, what the child gets, the child's end to close here) for one of its stdio."""
    if stdio != PIPE:
        return None, stdio, None
    read_fd, write_fd = os.pipe()  # both close-on-exec: the child gets its end as a dup
    ours, theirs = (write_fd, read_fd) if to_child else (read_fd, write_fd)
    return trio.lowlevel.FdStream(ours), theirs, theirs


def restore_signal_defaults() -> None:
    """In a forked child, before exec: every signal to its default action, none blocked.

    Ignored dispositions and the blocked mask survive exec. hostd may have been started with
    signals ignored (``nohup``, a background job of a non-interactive shell: SIGINT, SIGQUIT,
    SIGHUP) and Python itself ignores SIGPIPE and SIGXFSZ; without this a session's shell would not
    stop on Ctrl-C, nor a process on its terminal's hangup. (glibc's own signals 32 and 33 refuse
    any change and are left as they are.) Used by the PTY path (:mod:`hostd.ptyspawn`).
    """
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


#: Ignored by Python itself; ``Popen(restore_signals=True)`` gives the child their defaults.
_PYTHON_IGNORES = frozenset({signal.SIGPIPE, signal.SIGXFSZ})
#: Left ignored if they are: a background hostd whose terminal has ``tostop`` set would, with a
#: handler instead, be sent SIGTTOU again on every write to it (the write restarts after each).
_TTY_STOPS = frozenset({signal.SIGTTOU, signal.SIGTTIN})
_CATCHABLE = tuple(
    sig
    for sig in signal.valid_signals()
    if sig not in (signal.SIGKILL, signal.SIGSTOP) and sig < signal.SIGRTMIN and sig not in _TTY_STOPS
)


def _ignored(signum: int, frame: object) -> None:
    """Stands in for SIG_IGN in hostd (a caught signal, unlike an ignored one, is reset by exec)."""


def no_ignored_signals() -> None:
    """Catch with a no-op handler every signal hostd ignores (but Python's own two), so that a
    child does not inherit the ignore. Main thread only (elsewhere dispositions cannot change)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _CATCHABLE:
        if sig not in _PYTHON_IGNORES and signal.getsignal(sig) == signal.SIG_IGN:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, _ignored)


def unblock_signals() -> None:
    """At hostd's start, before any thread: no signal blocked (a child inherits the mask of the
    thread that starts it, and threads inherit it from the main thread)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


#: Used when hostd itself runs without PATH (e.g. from a bare systemd unit).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _hierarchy_root(cgroup: str) -> str:
    """Where the cgroup v2 hierarchy ``cgroup`` is in is mounted (strings, not Paths: this runs
    at every start)."""
    root = cgroup
    while os.path.exists((parent := os.path.dirname(root)) + "/cgroup.procs"):
        root = parent
    return root


#: Held while hostd is in a child's cgroup (:func:`born_in`) and by any other thread of hostd
#: while it forks (:mod:`hostd.ptyspawn`, for the fork only): a process forked meanwhile would
#: be born in that child's cgroup instead of the one meant for it (a session that has none
#: would stay there).
FORKS = threading.Lock()


class CgroupRefused(Exception):
    """hostd cannot step into a child's cgroup (it is gone, or not writable)."""


@contextlib.contextmanager
def born_in(cgroup: Path | None) -> Iterator[None]:
    """hostd in ``cgroup`` for the block, so that a child it starts there is born in it; back in
    its own cgroup after, whatever the block did. :class:`CgroupRefused` if it cannot go in."""
    if cgroup is None:
        yield
        return
    target = str(cgroup)
    mount = _hierarchy_root(target)
    home = os.path.join(mount, (own_cgroup() or "").lstrip("/"), "cgroup.procs")
    with FORKS:
        try:
            move_self(target + "/cgroup.procs")
        except OSError as exc:
            raise CgroupRefused(f"cannot join its cgroup {str(cgroup)!r}: {exc.strerror or exc}") from exc
        try:
            yield
        finally:
            try:
                move_self(home)
            except OSError as exc:
                # Never stay in a child's cgroup: killing that cgroup would kill hostd.
                log.error("cannot go back into cgroup %s (%s); moving to the hierarchy's root", home, exc)
                move_self(mount + "/cgroup.procs")


async def spawn(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    tree_id: str,
    cgroup: Path | None,
    stdin: int | None,
    stdout: int | None,
    stderr: int | None,
    pass_fds: Sequence[int] = (),
) -> Process:
    """Start ``argv`` as the leader of a new marked tree; see the module docstring.

    ``stdin``/``stdout``/``stderr`` are ``PIPE``, ``DEVNULL``, ``STDOUT`` (stderr only) or an fd
    the caller keeps owning. Raises :class:`RpcError` ``SPAWN_FAILED`` naming ``argv[0]`` and the
    OS error if the process cannot be started (not found, not executable, bad cwd, cgroup join
    refused).
    """
    child_env = dict(env)
    child_env.setdefault("PATH", DEFAULT_PATH)
    # Set last so that no caller-supplied env can take the tree's mark away.
    child_env[TREE_ENV] = tree_id
    await trio.lowlevel.checkpoint_if_cancelled()
    no_ignored_signals()
    pipes: list[tuple[trio.lowlevel.FdStream | None, int | None, int | None]] = []
    try:
        pipes.append(_pipe(stdin, to_child=True))  # one by one: a failure closes those made
        pipes.append(_pipe(stdout, to_child=False))
        # STDOUT: the child's stderr is a dup of its stdout (Popen's doing), whatever that is.
        pipes.append(_pipe(stderr, to_child=False) if stderr != STDOUT else (None, STDOUT, None))
        with born_in(cgroup):
            popen = subprocess.Popen(
                list(argv),
                stdin=pipes[0][1],
                stdout=pipes[1][1],
                stderr=pipes[2][1],
                cwd=cwd,
                env=child_env,
                start_new_session=True,
                restore_signals=True,
                close_fds=True,
                pass_fds=tuple(pass_fds),
            )
    except BaseException as exc:
        for stream, _, _ in pipes:
            if stream is not None:
                stream.close()
        if isinstance(exc, (OSError, ValueError)):
            raise _spawn_failed(argv[0], cwd, exc) from exc
        if isinstance(exc, CgroupRefused):
            raise RpcError(ErrorCode.SPAWN_FAILED, f"cannot start {argv[0]!r}: {exc}", argv0=argv[0]) from exc
        raise
    finally:
        for _, _, theirs in pipes:
            if theirs is not None:
                os.close(theirs)
    return Process(popen, pipes[0][0], pipes[1][0], pipes[2][0])


def _spawn_failed(argv0: str, cwd: str, exc: OSError | ValueError) -> RpcError:
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        where = f" (cwd {cwd!r})" if exc.filename == cwd else ""
        return RpcError(
            ErrorCode.SPAWN_FAILED,
            f"cannot start {argv0!r}: {reason}{where}",
            argv0=argv0,
            errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
            error=str(exc),
        )
    # A NUL byte in argv or env, or a variable name with "=": refused before the fork.
    return RpcError(ErrorCode.SPAWN_FAILED, f"cannot start {argv0!r}: {exc}", argv0=argv0, error=str(exc))


def exit_status(returncode: int) -> tuple[int | None, int | None]:
    """``Popen.returncode`` as ``(exit_code, signal)``: exactly one of them is set."""
    if returncode < 0:
        return None, -returncode
    return returncode, None


async def wait_exit(proc: Process) -> tuple[int | None, int | None]:
    """Wait for our child ``proc`` to exit (and reap it); ``(exit_code, signal)``."""
    return exit_status(await proc.wait())


async def wait_pid_exit(pid: int) -> tuple[int | None, int | None]:
    """Wait for any process ``pid`` to end, child or not (pidfd); ``(exit_code, signal)``.

    A process that is not our child cannot be reaped by us, so its status is unknown:
    ``(None, None)``. Returns at once if ``pid`` is already gone.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None, None
    try:
        await trio.lowlevel.wait_readable(fd)
        try:
            result = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            return None, None  # not ours (the usual case after a hostd restart)
        if result is None:
            return None, None
        if result.si_code == os.CLD_EXITED:
            return result.si_status, None
        return None, result.si_status
    finally:
        with contextlib.suppress(OSError):
            trio.lowlevel.notify_closing(fd)
        os.close(fd)


def open_log(path: Path) -> int:
    """Open ``path`` for appending (created 0600); the caller closes the fd after spawning."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return fd


async def run_to_end(argv: Sequence[str], *, timeout_s: float) -> tuple[int, bytes]:
    """Run ``argv`` (hostd's own command, checking new code before an upgrade) to its end:
    (exit code, what it wrote to stderr, else stdout). Raises ``trio.TooSlowError`` past
    ``timeout_s`` (the process is killed) and ``OSError`` when it cannot start."""
    with trio.fail_after(timeout_s):
        done = await trio.run_process(list(argv), capture_stdout=True, capture_stderr=True, check=False)
    return done.returncode, done.stderr or done.stdout


def replace_image(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """``execve`` hostd's own pid into ``argv`` (an upgrade in place: every child stays its child,
    and only inheritable fds cross). Returns only by raising ``OSError``."""
    os.execve(argv[0], list(argv), dict(env))
