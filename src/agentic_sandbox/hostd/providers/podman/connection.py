"""One podman API socket, asked through podman-py in worker threads, and the service hostd may start on it.

hostd is the only process that talks to podman (DESIGN.md §2). podman-py is blocking HTTP over the
Unix socket of a ``podman system service``; :func:`call` runs one function with a fresh
client in a worker thread, bounded in requests (per socket operation) and in trio (the thread is
abandoned when the deadline passes), so a wedged podman never blocks hostd's event loop. Every
failure to reach podman is :class:`PodmanUnreachable`, an answer that is no API answer
:class:`PodmanBadAnswer`; podman's own refusals (no such image, a bad limit) stay podman-py's
``APIError`` for the caller to judge.

The service (:meth:`PodmanApi.ensure_service`): with ``AIWG_PODMAN_SERVICE=1`` hostd starts
``podman system service --time 0`` on its socket when nothing answers there, with runc, the
cgroupfs manager, the configured storage (DESIGN.md §6 says why here) and a containers.conf of
hostd's (``<state>/podman-containers.conf``: ended exec sessions kept 30 s, not 5 minutes), as
the leader of a marked tree of its own. It is hostd's child: :meth:`PodmanApi.close` stops it (SIGTERM, then
SIGKILL), and only its leader, because the ``conmon`` processes it forked for containers carry its
tree mark and must outlive it: containers keep running across a hostd restart, and the next hostd
starts a service again and re-adopts them. A service that is already there (a hostd killed without
cleanup left it, or an operator runs one) is used as it is.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from ... import procspawn
from ...config import HostdConfig
from ...statefile import write_private

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
#: How long a service hostd started may take to answer.
SERVICE_START_S = 20.0
SERVICE_STOP_S = 10.0
#: How long the service hostd starts keeps an ended exec session for its client (podman: 300).
EXEC_EXIT_DELAY_S = 30
MAX_REASON_CHARS = 300


class PodmanUnreachable(Exception):
    """podman could not be asked (no socket, refused, timed out, connection broken)."""


class PodmanBadAnswer(Exception):
    """podman answered, but not as its API says it does."""


def reason(exc: BaseException) -> str:
    """A short, single-line account of ``exc`` for notes and error messages."""
    text = " ".join((str(exc) or type(exc).__name__).split())
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


async def call(url: str, fn: Callable[[Any], T], *, timeout_s: float) -> T:
    """``fn(client)`` with a fresh podman-py client on ``url`` ("" = none), in a worker thread.

    Raises :class:`PodmanUnreachable` when podman cannot be asked (within ``timeout_s``, per socket
    operation and in all), :class:`PodmanBadAnswer` for an answer that is none of its API's;
    podman-py's ``APIError`` (podman answered with an error) and anything ``fn`` raises propagate
    unchanged.
    """
    if not url:
        raise PodmanUnreachable("no podman socket configured (AIWG_PODMAN_SOCKET)")
    try:
        with trio.fail_after(timeout_s + 1):
            return await trio.to_thread.run_sync(_call_sync, url, fn, timeout_s, abandon_on_cancel=True)
    except trio.TooSlowError:
        raise PodmanUnreachable(f"podman did not answer within {timeout_s:g} s") from None


def _call_sync(url: str, fn: Callable[[Any], T], timeout_s: float) -> T:
    # Imported here: podman-py pulls in requests, which only these calls need.
    import podman
    import podman.errors
    import requests

    path = url.removeprefix("unix://")
    if not os.path.exists(path):
        raise PodmanUnreachable(f"podman socket {path} does not exist")
    try:
        with podman.PodmanClient(base_url=url, timeout=max(1, math.ceil(timeout_s))) as client:
            return fn(client)
    except podman.errors.APIError:
        raise  # podman answered (an OSError too, through requests' hierarchy)
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise PodmanUnreachable(f"podman unreachable: {reason(exc)}") from exc
    except requests.RequestException as exc:
        raise PodmanBadAnswer(f"podman gave an unexpected answer: {reason(exc)}") from exc
    except OSError as exc:
        raise PodmanUnreachable(f"podman unreachable: {reason(exc)}") from exc


class PodmanApi:
    """The podman API socket of ``config.podman_socket`` (a ``unix://`` URL, or "" for none)."""

    def __init__(self, config: HostdConfig, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._config = config
        self.url = config.podman_socket
        self.path = self.url.removeprefix("unix://")
        self.timeout_s = timeout_s
        self.binary = shutil.which("podman")
        self._service: procspawn.Process | None = None

    # -- calls ----------------------------------------------------------------------------------

    async def call(self, fn: Callable[[Any], T], *, timeout_s: float | None = None) -> T:
        """``fn(client)`` on this socket (see :func:`call`)."""
        return await call(self.url, fn, timeout_s=self.timeout_s if timeout_s is None else timeout_s)

    async def ping(self) -> str | None:
        """None when podman answers, else why not."""
        try:
            ok = await self.call(lambda client: client.ping(), timeout_s=3.0)
        except PodmanUnreachable as exc:
            return str(exc)
        except Exception as exc:  # podman answered, but not as a podman API does
            return f"podman unusable: {reason(exc)}"
        return None if ok else "podman did not answer its ping"

    # -- the service hostd starts -----------------------------------------------------------

    def _service_argv(self) -> list[str]:
        assert self.binary is not None
        argv = [self.binary, "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
        config = self._config
        if config.podman_root:
            argv += ["--root", config.podman_root]
        if config.podman_runroot:
            argv += ["--runroot", config.podman_runroot]
        if config.podman_storage_driver:
            argv += ["--storage-driver", config.podman_storage_driver]
        return [*argv, "system", "service", "--time", "0", self.url]

    def _answers(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(self.path)
                return True
            except OSError:
                return False

    async def ensure_service(self) -> str | None:
        """Start the service when configured to and nothing answers; None once podman answers."""
        unreachable = await self.ping()
        if unreachable is None or not self._config.podman_service:
            return unreachable
        if self.binary is None:
            return "podman is not installed"
        if self._service is not None and self._service.returncode is None:
            return unreachable  # ours is still starting (or hung): do not start a second one
        if self._answers():
            return unreachable  # something listens there that is not ours; never replace it
        await trio.to_thread.run_sync(self._prepare_dirs)
        log_path = os.path.join(self._config.state_dir, "podman-service.log")
        log_fd = procspawn.open_log(Path(log_path))
        try:
            self._service = await procspawn.spawn(
                self._service_argv(),
                cwd="/",
                env={
                    "PATH": os.environ.get("PATH") or procspawn.DEFAULT_PATH,
                    "HOME": self._config.state_dir,
                    "CONTAINERS_CONF": self._conf_path(),
                },
                tree_id=self._config.tree_id("podman", "service"),
                cgroup=None,
                stdin=procspawn.DEVNULL,
                stdout=log_fd,
                stderr=procspawn.STDOUT,
            )
        except Exception as exc:
            return f"cannot start podman system service: {reason(exc)}"
        finally:
            os.close(log_fd)
        log.info("started podman system service (pid %d) on %s", self._service.pid, self.url)
        with trio.move_on_after(SERVICE_START_S):
            while self._service.returncode is None:
                if self._answers() and await self.ping() is None:
                    return None
                await trio.sleep(0.05)
        if self._service.returncode is not None:
            return f"podman system service exited with {self._service.returncode} (see {log_path})"
        return f"podman system service did not answer within {SERVICE_START_S:g} s"

    def _conf_path(self) -> str:
        return os.path.join(self._config.state_dir, "podman-containers.conf")

    def _prepare_dirs(self) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        # podman keeps an API exec session (and its conmon) for exit_command_delay after it ended,
        # 5 minutes by default, for a client to ask its exit code: ours asks at once.
        write_private(Path(self._conf_path()), f"[engine]\nexit_command_delay = {EXEC_EXIT_DELAY_S}\n".encode())
        for path in (self._config.podman_root, self._config.podman_runroot):
            if path:
                os.makedirs(path, mode=0o700, exist_ok=True)
        if os.path.exists(self.path) and not self._answers():
            os.unlink(self.path)  # a stale socket of a service that is gone

    async def close(self) -> None:
        """Stop the service hostd started (its leader only: containers' conmons stay)."""
        proc, self._service = self._service, None
        if proc is None or proc.returncode is not None:
            return
        with trio.CancelScope(shield=True):
            proc.send_signal(signal.SIGTERM)
            with trio.move_on_after(SERVICE_STOP_S):
                await proc.wait()
                return
            proc.kill()
            await proc.wait()
