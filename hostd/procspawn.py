"""The one place hostd starts pipe-based processes (instance main processes, execs).

Every process started here is the leader of a new tree, marked the three ways
:mod:`hostd.proctree` relies on to kill it whole:

* ``start_new_session=True``: the child calls ``setsid``, so ``pgid == pid``;
* ``AIWG_TREE=<tree id>`` in its environment, inherited by every descendant;
* the pre-exec function restores every signal to its default (see :func:`restore_signal_defaults`)
  and moves it into its own cgroup (from :meth:`Cgroups.join_fn`, when there is one)
  before ``exec``, so even its first instruction runs inside the cgroup.

File descriptors: ``close_fds=True``; only ``pass_fds`` (the control channel) crosses into the
child, at the same fd number. The caller owns the trio streams of the returned process and must
close them; the child's ends of pipes are closed here by trio.

Waiting: :func:`wait_exit` for our own children (exit code known), :func:`wait_pid_exit` for a
process hostd did not start in this run (re-adopted after a restart; exit code only if it
happens to be our child).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import trio

from proto import ErrorCode

from .errors import RpcError
from .proctree import TREE_ENV, Cgroups

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT


def restore_signal_defaults() -> None:
    """In a forked child, before exec: every signal to its default action, none blocked.

    Ignored dispositions and the blocked mask survive exec. hostd may have been started with
    signals ignored (``nohup``, a background job of a non-interactive shell: SIGINT, SIGQUIT,
    SIGHUP) and Python itself ignores SIGPIPE and SIGXFSZ; without this a session's shell would not
    stop on Ctrl-C, nor a process on its terminal's hangup. (glibc's own signals 32 and 33 refuse
    any change and are left as they are.)
    """
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _child_setup(cgroup: Path | None) -> Callable[[], None]:
    join = Cgroups.join_fn(cgroup)

    def setup() -> None:
        restore_signal_defaults()
        if join is not None:
            join()

    return setup


#: Used when hostd itself runs without PATH (e.g. from a bare systemd unit).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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
) -> trio.Process:
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
    try:
        return await trio.lowlevel.open_process(
            list(argv),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            env=child_env,
            start_new_session=True,
            preexec_fn=_child_setup(cgroup),
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = f" (cwd {cwd!r})" if exc.filename == cwd else ""
        raise RpcError(
            ErrorCode.SPAWN_FAILED,
            f"cannot start {argv[0]!r}: {reason}{where}",
            argv0=argv[0],
            errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
            error=str(exc),
        ) from exc
    except ValueError as exc:
        # A NUL byte in argv or env, or a variable name with "=": refused before the fork.
        raise RpcError(
            ErrorCode.SPAWN_FAILED, f"cannot start {argv[0]!r}: {exc}", argv0=argv[0], error=str(exc)
        ) from exc
    except subprocess.SubprocessError as exc:
        # Raised when the pre-exec function (joining the cgroup) failed in the child.
        raise RpcError(
            ErrorCode.SPAWN_FAILED,
            f"cannot start {argv[0]!r}: {exc} (joining cgroup {cgroup})",
            argv0=argv[0],
            error=str(exc),
        ) from exc


def exit_status(returncode: int) -> tuple[int | None, int | None]:
    """``Popen.returncode`` as ``(exit_code, signal)``: exactly one of them is set."""
    if returncode < 0:
        return None, -returncode
    return returncode, None


async def wait_exit(proc: trio.Process) -> tuple[int | None, int | None]:
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
