"""Upgrade in place: hostd replaces its own image with the code now installed, losing nothing.

Asked by ``SIGHUP`` (``systemctl reload``) or an ``UpgradeRequest`` (``agentic-hostctl upgrade``).
:class:`Upgrader` runs one upgrade at a time, in its own task:

1. **Check the new code** (:meth:`Upgrader.check`): run the command hostd would become with
   ``--check-handover N``. It must import, read its configuration and say it takes over a document
   of version N. Anything else (a syntax error, a missing module, a document version it does not
   read) refuses the upgrade with what the new code said, and this image goes on serving.
2. **Quiesce the clients** (:meth:`hostd.server.RpcServer.hand_over`): stop accepting (the socket
   stays bound, so clients queue in its backlog and never see it missing), tell every connection,
   let running calls finish and wait for clients to end their side, up to :data:`DRAIN_S`.
3. **Freeze** the sessions' and execs' I/O tasks (:mod:`hostd.freezer`) and persist the instance
   and pool tables.
4. **Write the document** (:mod:`hostd.handover`) into a memfd, mark it and every fd it names
   inheritable, and ``execve`` the same command line: same pid, so every child stays its child.

If the ``execve`` itself fails, everything is let go again (fds close-on-exec, tasks thawed, the
socket accepting) and the upgrade is reported failed. What the new image does with the document is
:func:`hostd.main.take_over`'s.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable

import trio

from agentic_sandbox.proto import ErrorCode

from . import handover, procspawn, sdnotify
from .errors import RpcError
from .execs import ExecRegistry
from .instances import InstanceRegistry
from .listener import BoundSocket
from .pools import WarmPools
from .server import RpcServer
from .sessions import SessionRegistry

log = logging.getLogger(__name__)

#: How long clients get to finish what they asked and end their side before hostd hands over anyway.
DRAIN_S = 5.0
#: How long the new code may take to import and answer the check.
CHECK_TIMEOUT_S = 60.0
#: The flag of ``agentic-hostd`` that runs the check (:func:`hostd.main.main`).
CHECK_FLAG = "--check-handover"


def command() -> list[str]:
    """The command line hostd was started with, to start the new code the same way (``python -m
    agentic_sandbox.hostd.main ...``, or the ``agentic-hostd`` script): the interpreter's own argv."""
    return [sys.executable, *sys.orig_argv[1:]]


class Upgrader:
    """See the module docstring. Built by :func:`hostd.main.run_hostd` with what it hands over."""

    def __init__(
        self,
        *,
        server: RpcServer,
        bound: BoundSocket,
        sessions: SessionRegistry,
        execs: ExecRegistry,
        instances: InstanceRegistry,
        pools: WarmPools,
        started_at: float,
        upgrades: int,
        version: str,
        command: Callable[[], list[str]] = command,
    ) -> None:
        self._server = server
        self._bound = bound
        self._sessions = sessions
        self._execs = execs
        self._instances = instances
        self._pools = pools
        self.started_at = started_at
        self.upgrades = upgrades
        self._version = version
        self._command = command
        #: Upgrades asked for, each with whether the new code was checked already.
        self._asks, self._asked = trio.open_memory_channel[bool](1)
        self._lock = trio.Lock()

    async def check(self) -> None:
        """Raise ``hostd.upgrade_refused`` unless the code now installed takes over a document of
        this version (see the module docstring)."""
        argv = [*self._command(), CHECK_FLAG, str(handover.VERSION)]
        try:
            code, output = await procspawn.run_to_end(argv, timeout_s=CHECK_TIMEOUT_S)
        except trio.TooSlowError:
            raise RpcError(
                ErrorCode.UPGRADE_REFUSED,
                f"the new code did not answer the handover check within {CHECK_TIMEOUT_S:g} s",
            ) from None
        except OSError as exc:
            raise RpcError(ErrorCode.UPGRADE_REFUSED, f"cannot run the new code ({argv[0]}): {exc}") from None
        if code != 0:
            said = output.decode(errors="replace").strip().splitlines()
            raise RpcError(
                ErrorCode.UPGRADE_REFUSED,
                f"the new code refused the handover (exit {code}): {said[-1] if said else 'no output'}",
                exit_code=code,
                output="\n".join(said[-20:]),
            )

    def ask(self, *, checked: bool) -> bool:
        """Ask for an upgrade (``checked``: :meth:`check` passed just now, else :meth:`run` checks
        first); False if one is asked for already."""
        try:
            self._asks.send_nowait(checked)
        except trio.WouldBlock:
            return False
        if checked:
            # Decided: a client that connects after the answer reaches the new image, not this one.
            self._server.stop_accepting()
        return True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Upgrade whenever asked, one at a time. A refused or failed upgrade is logged and this
        image goes on serving."""
        task_status.started()
        async for checked in self._asked:
            try:
                await self.upgrade(checked=checked)
            except RpcError as exc:
                log.error("upgrade refused: %s %s", exc.message, exc.details.get("output", ""))
                sdnotify.status(f"upgrade refused: {exc.message}")
            except Exception:
                # Undone already (upgrade): a bug in an upgrade must not take the serving hostd down.
                log.exception("upgrade failed; serving on")
                sdnotify.status("upgrade failed; serving on (see the log)")

    async def upgrade(self, *, checked: bool = False) -> None:
        """Check (unless ``checked``), quiesce, freeze, hand over. Returns only if it did not happen
        (raises why)."""
        async with self._lock:
            if not checked:
                await self.check()
            log.info("upgrade: the new code accepts handover version %d; handing over", handover.VERSION)
            sdnotify.reloading()
            started = time.monotonic()
            try:
                cut = await self._server.hand_over(DRAIN_S)
                if cut:
                    log.warning("upgrade: %d connection(s) did not finish within %g s; they are cut", cut, DRAIN_S)
                await self._sessions.freezer.freeze()
                await self._execs.freezer.freeze()
                self._instances.persist()
                self._pools.flush()
                document = self._document()
            except BaseException:
                self._undo()
                raise
            self._exec(document, started)  # returns only on failure

    def _undo(self) -> None:
        """The handover did not happen: let everything go on in this image."""
        self._sessions.freezer.thaw()
        self._execs.freezer.thaw()
        self._server.resume()
        sdnotify.ready("upgrade failed; serving on")

    def _document(self) -> handover.Document:
        bound = self._bound
        return handover.Document(
            version=handover.VERSION,
            written_by=self._version,
            written_at=time.time(),
            pid=os.getpid(),
            listener_fd=bound.sock.fileno(),
            socket_path=bound.path,
            socket_ino=bound.ino,
            started_at=self.started_at,
            upgrades=self.upgrades + 1,
            sessions=self._sessions.snapshot(),
            execs=self._execs.snapshot(),
            fd_store=self._sessions.fdstore.state_fd if self._sessions.fdstore is not None else None,
        )

    def _exec(self, document: handover.Document, started: float) -> None:
        fds = document.fds()
        doc_fd = handover.write(document)
        argv = self._command()
        env = dict(os.environ)
        env[handover.FD_ENV] = str(doc_fd)
        try:
            for fd in fds:
                os.set_inheritable(fd, True)
            log.info(
                "upgrade: handing over %d sessions and %d execs to %s (quiesced in %.0f ms)",
                len(document.sessions),
                len(document.execs),
                " ".join(argv),
                (time.monotonic() - started) * 1000,
            )
            for handler in logging.getLogger().handlers:
                handler.flush()
            procspawn.replace_image(argv, env)
        except OSError as exc:
            for fd in fds:
                os.set_inheritable(fd, False)
            os.close(doc_fd)
            self._undo()
            raise RpcError(ErrorCode.UPGRADE_REFUSED, f"cannot execute the new code ({argv[0]}): {exc}") from exc
