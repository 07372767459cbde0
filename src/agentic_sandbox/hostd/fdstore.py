"""Sessions that survive a hostd crash: the service manager's file descriptor store.

Under systemd (``NOTIFY_SOCKET`` set, the unit's ``FileDescriptorStoreMax=`` above 0) hostd keeps a
copy of every running session's PTY master in systemd's fd store (``FDSTORE=1``, named
``s-<session id>``) and one memfd named ``state`` that describes them (:class:`StoredSessions`,
rewritten whenever a session starts or ends). A master that is stored keeps the session's terminal
open while hostd is dead: its processes get no hangup and go on. When the session ends, its copy is
removed (``FDSTOREREMOVE=1``; systemd also drops a stored fd that hangs up by itself).

A hostd that starts and finds these fds (``LISTEN_FDS``/``LISTEN_FDNAMES``, :mod:`hostd.listenfds`)
takes the sessions back (:func:`recover`) and re-adopts each one whose leader still runs and still
carries its tree mark. Their output before the crash is replayed from the spool, which sessions
write through while the store is in use (every chunk is on disk before anything is sent of it), so
the sequence numbers go on where they were. What the crash cut off is the chunk hostd had read and
not yet written down, and the exit code: the leader is no longer hostd's child, so its exit is seen
on a pidfd and the session ends with no exit code and the reason ``lost``.

Without a service manager (a terminal, a container, tests that do not ask for it) none of this
runs, and a crash ends the sessions with hostd, as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from . import sdnotify
from .handover import SessionRecord
from .listenfds import take_listen_fds

log = logging.getLogger(__name__)

#: The fd name of the state memfd.
STATE_NAME = "state"
#: The fd name prefix of a session's PTY master.
SESSION_PREFIX = "s-"
#: The layout of :class:`StoredSessions`.
VERSION = 1


class StoredSessions(msgspec.Struct, kw_only=True):
    """The state memfd's content: the running sessions (each with its pid)."""

    version: int
    sessions: list[SessionRecord]


@dataclass
class Recovered:
    """What a previous hostd left in the store: its sessions and their masters, by session id."""

    sessions: list[SessionRecord] = field(default_factory=list)
    masters: dict[str, int] = field(default_factory=dict)


class FdStore:
    """hostd's side of the fd store; every method does nothing when the store is not in use."""

    def __init__(self, env: Mapping[str, str], state_fd: int | None) -> None:
        self._env = env
        #: The state memfd (kept open: rewritten in place, its stored copy is the same file).
        self.state_fd = state_fd

    @property
    def enabled(self) -> bool:
        return self.state_fd is not None

    def keep(self, session_id: str, master_fd: int, sessions: list[SessionRecord]) -> None:
        """A session started: store its master and the new state."""
        if self.state_fd is None:
            return
        if not sdnotify.store_fds(SESSION_PREFIX + session_id, [master_fd], env=self._env):
            log.warning("session %s: its terminal could not be kept in the fd store; a crash would end it", session_id)
        self.save(sessions)

    def drop(self, session_id: str, sessions: list[SessionRecord]) -> None:
        """A session ended: remove its master and write the new state."""
        if self.state_fd is None:
            return
        sdnotify.remove_fds(SESSION_PREFIX + session_id, env=self._env)
        self.save(sessions)

    def save(self, sessions: list[SessionRecord]) -> None:
        """Rewrite the state memfd (the store holds the same open file, so nothing is sent)."""
        fd = self.state_fd
        if fd is None:
            return
        data = msgspec.msgpack.encode(StoredSessions(version=VERSION, sessions=sessions))
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except OSError as exc:
            log.error("cannot write the fd store's state: %s; a crash would end the sessions", exc)


def open_store(env: dict[str, str] | os._Environ[str], *, wanted: bool) -> tuple[FdStore, Recovered]:
    """At hostd's start: take what a previous hostd left in the store, and set the store up.

    ``wanted``: the configuration asks for it and a service manager is there to hold the fds.
    Fds passed that are not understood are closed; a state that does not decode recovers nothing.
    """
    passed = take_listen_fds(env)
    recovered = Recovered()
    state_fds = passed.pop(STATE_NAME, [])
    state_fd = state_fds[0] if state_fds else None
    for extra in state_fds[1:]:
        os.close(extra)
    if state_fd is not None:
        try:
            raw = os.pread(state_fd, 64 * 1024 * 1024, 0)
            stored = msgspec.msgpack.decode(raw, type=StoredSessions)
            if stored.version != VERSION:
                raise msgspec.DecodeError(f"version {stored.version}, this hostd reads {VERSION}")
            recovered.sessions = stored.sessions
        except (OSError, msgspec.DecodeError) as exc:
            log.error("the fd store's state cannot be read (%s): its sessions are not recovered", exc)
    for name, fds in passed.items():
        if name.startswith(SESSION_PREFIX) and fds:
            recovered.masters[name.removeprefix(SESSION_PREFIX)] = fds[0]
            fds = fds[1:]
        for fd in fds:
            os.close(fd)
    if not wanted or sdnotify.socket_address(env) is None:
        for fd in recovered.masters.values():
            os.close(fd)
        if state_fd is not None:
            os.close(state_fd)
        return FdStore(env, None), Recovered()
    if state_fd is None:
        state_fd = os.memfd_create("aiwg-hostd-state", os.MFD_CLOEXEC)
        if not sdnotify.store_fds(STATE_NAME, [state_fd], env=env):
            # Nobody to keep the fds: not worth writing every session's output through to disk.
            log.warning("the service manager did not take hostd's state into its fd store: a crash ends the sessions")
            os.close(state_fd)
            for fd in recovered.masters.values():
                os.close(fd)
            return FdStore(env, None), Recovered()
    return FdStore(env, state_fd), recovered
