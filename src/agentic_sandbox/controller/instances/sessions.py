"""PTY sessions of an instance: create, start, list, read, delete; the records live on hostd.

The controller keeps no session state of its own: a session is a hostd PTY session, so it outlives
every controller restart and every attached client. This service checks that the instance is in the
catalog and that a session belongs to the instance the caller named (a session id under another
instance is ``session.not_found``, never another instance's shell), then asks hostd.

A session created with ``start=False`` is *pending*: hostd holds it (so it too outlives a controller
restart) and nothing runs until :meth:`SessionService.start`, whose :class:`Launch` fields replace
the ones given at creation (the attach socket's first controller starts it, with its
``pty.join_session`` launch fields). Of two starts the first wins; the second changes nothing.

Errors: :mod:`controller.errors` only (hostd's own arrive translated by :mod:`controller.hostlink`:
``session.not_found``, ``session.exited``, ``session.pending``, ``instance.invalid_state``; 503 when
hostd is away or refuses, e.g. at its session limit).
"""

from __future__ import annotations

import builtins
import logging
import re
from typing import TYPE_CHECKING

import msgspec

from agentic_sandbox.proto import messages as m

from ..errors import NotFound, Unavailable

if TYPE_CHECKING:
    from ..hostlink import HostdLink
    from ..hosts.registry import HostRegistry
    from .service import InstanceService

#: hostd's ``ObjectId``: anything else cannot name a session, so it is a 404 without asking.
_SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
DEFAULT_ARGV = ("/bin/bash", "-l")
DEFAULT_COLS = 120
DEFAULT_ROWS = 30

log = logging.getLogger(__name__)


class Launch(msgspec.Struct, kw_only=True, frozen=True):
    """What a pending session starts with; each field given replaces the one given at its creation."""

    argv: builtins.list[str] | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    cols: int | None = None
    rows: int | None = None


def session_not_found(session_id: str) -> NotFound:
    return NotFound("session.not_found", f"no session with id {session_id!r} in this instance")


class SessionService:
    def __init__(self, instances: InstanceService, link: HostdLink, *, hosts: HostRegistry | None = None) -> None:
        self.instances = instances
        self.link = link
        #: This host among others (None: alone): whether it takes new sessions (drain).
        self.hosts = hosts

    async def create(
        self,
        instance_id: str,
        *,
        argv: builtins.list[str] | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        cols: int = DEFAULT_COLS,
        rows: int = DEFAULT_ROWS,
        start: bool = True,
    ) -> m.SessionInfo:
        rec = await self.instances.record(instance_id)  # 404 from the catalog first
        self.link.require_host(rec.id, rec.host_id)
        if self.hosts is not None:
            self.hosts.require_open()  # a draining host takes no new session
        request = m.SessionCreateRequest(
            instance_id=instance_id,
            argv=list(argv or DEFAULT_ARGV),
            cwd=cwd,
            env=dict(env or {}),
            cols=cols,
            rows=rows,
            deferred=not start,
        )
        info: m.SessionInfo = (await self.link.call(request)).session
        if not start and not info.pending:
            # A hostd older than pending sessions ignores ``deferred`` and starts it: undo that.
            await self.link.call(m.SessionDeleteRequest(session_id=info.session_id))
            raise Unavailable("internal.unavailable", "this hostd cannot hold a session unstarted; upgrade hostd")
        return info

    async def start(self, info: m.SessionInfo, launch: Launch) -> tuple[m.SessionInfo, bool]:
        """Start a pending session (``info`` from :meth:`get`); (the session now, whether this started it)."""
        request = m.SessionStartRequest(
            session_id=info.session_id,
            argv=launch.argv,
            cwd=launch.cwd,
            env=launch.env,
            cols=launch.cols,
            rows=launch.rows,
        )
        answer = await self.link.call(request)
        if answer.started:
            log.info("session %s started: argv %r", info.session_id, answer.session.argv)
        return answer.session, answer.started

    async def list(self, instance_id: str) -> builtins.list[m.SessionInfo]:
        await self.instances.record(instance_id)
        return (await self.link.call(m.SessionListRequest(instance_id=instance_id))).sessions

    async def get(self, instance_id: str, session_id: str) -> m.SessionInfo:
        await self.instances.record(instance_id)
        if not _SESSION_ID_RE.match(session_id):
            raise session_not_found(session_id)
        info: m.SessionInfo = (await self.link.call(m.SessionGetRequest(session_id=session_id))).session
        if info.instance_id != instance_id:
            raise session_not_found(session_id)
        return info

    async def delete(self, instance_id: str, session_id: str) -> None:
        await self.get(instance_id, session_id)
        await self.link.call(m.SessionDeleteRequest(session_id=session_id))
