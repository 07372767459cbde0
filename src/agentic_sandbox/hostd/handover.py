"""The handover document: what one hostd image tells the next when it upgrades in place.

An upgrade (:mod:`hostd.upgrade`) ``execve``s hostd's own pid into the code now installed. File
descriptors marked inheritable survive that; nothing else does. The document names each of them
(the listening socket, every PTY master, exec pipe and control channel) and carries what only
memory held: every session's and exec's table entry, the output rings' in-memory entries (the older
output is in the spool's segment files, which stay where they are) and the input not yet written.
The instance table and the warm pools are not in it: they are in the state files already, and the
new image re-adopts them the way a restarted hostd does (with exit codes kept, since every process
hostd started is still its child).

Format: msgpack of :class:`Document`, in a memfd whose fd number the new image finds in
``AIWG_HANDOVER_FD``. :data:`VERSION` says which layout it has. A reader looks at the version alone
first (:func:`read`) and refuses a document it does not understand before it touches anything; the
old image asks the new code the same question before it hands over (``agentic-hostd
--check-handover N``), so a broken install, or one that cannot read this document, fails the upgrade
and the old image keeps serving. Bump :data:`VERSION` with every change of layout or meaning; a new
image that still reads an older version says so in :data:`READABLE`.
"""

from __future__ import annotations

import os

import msgspec

from agentic_sandbox.proto import messages as m

#: The layout this code writes.
VERSION = 1
#: The layouts this code can take over from.
READABLE = frozenset({VERSION})
#: The variable naming the document's fd in the new image (removed from the environment at once).
FD_ENV = "AIWG_HANDOVER_FD"


class HandoverRefused(Exception):
    """The document cannot be taken over (unknown version, unreadable); nothing was touched."""


class SegmentState(msgspec.Struct, array_like=True):
    path: str
    first_seq: int
    next_seq: int
    size: int


class RingState(msgspec.Struct, kw_only=True):
    """An output ring: its next sequence, what memory holds, the spool's segments and whether it is
    closed (the child ended)."""

    next_seq: int
    entries: list[tuple[int, int, bytes]]
    spool: list[SegmentState] | None = None
    spool_failed: bool = False
    closed: bool = False


class EndState(msgspec.Struct, kw_only=True):
    """How far a child's end has come: reaped (with its status) and recorded."""

    reaped: bool = False
    exit_code: int | None = None
    signal: int | None = None
    exited_at: float | None = None
    kill_reason: str | None = None
    end_reason: str | None = None
    done: bool = False


class SessionRecord(msgspec.Struct, kw_only=True):
    """A session's entry in hostd's table: what a new image of hostd (this document), or a hostd
    started after a crash (:mod:`hostd.fdstore`), needs to know of it besides its output."""

    id: str
    instance_id: str
    argv: list[str]
    cwd: str
    cols: int
    rows: int
    created_at: float
    launch: m.SessionCreateRequest
    #: None while pending (nothing started yet).
    pid: int | None = None
    cgroup: str | None = None
    proxied: bool = False


class SessionState(msgspec.Struct, kw_only=True):
    session: SessionRecord
    master_fd: int | None = None
    pending_input: bytes = b""
    end: EndState
    ring: RingState


class StdinWrite(msgspec.Struct, array_like=True):
    data: bytes
    eof: bool


class ExecState(msgspec.Struct, kw_only=True):
    id: str
    instance_id: str
    argv: list[str]
    cwd: str
    created_at: float
    pid: int
    stdin_fd: int | None
    stdout_fd: int | None
    stderr_fd: int | None
    cgroup: str | None = None
    proxied: bool = False
    control: bool = False
    control_flow: bool = False
    #: The control channel: a connected socket, or a listening one at ``control_path`` nobody took yet.
    control_fd: int | None = None
    control_listener_fd: int | None = None
    control_path: str | None = None
    #: A control line read only in part, and whether it is one too long being skipped.
    control_partial: bytes = b""
    control_skipping: bool = False
    unacked: list[tuple[int, int]] = []
    #: Streams not at their end yet, by ring kind (1 stdout, 2 stderr, 3 the control channel).
    open_streams: list[int]
    stdin_open: bool
    stdin_queue: list[StdinWrite] = []
    #: Wall-clock time of the exec's timeout, if it has one.
    deadline: float | None = None
    end: EndState
    ring: RingState


class Document(msgspec.Struct, kw_only=True):
    version: int
    #: The hostd version of the image that wrote it.
    written_by: str
    written_at: float
    pid: int
    listener_fd: int
    socket_path: str
    #: (st_dev, st_ino) of the socket file the listener is bound to (so only that file is removed).
    socket_ino: tuple[int, int]
    #: When this hostd first started (before any upgrade) and how many upgrades it has been through.
    started_at: float
    upgrades: int
    sessions: list[SessionState]
    execs: list[ExecState]
    #: The fd store's state memfd (:mod:`hostd.fdstore`), when sessions are kept there.
    fd_store: int | None = None

    def fds(self) -> list[int]:
        """Every descriptor the document names: what must survive the ``execve``."""
        found = [self.listener_fd]
        if self.fd_store is not None:
            found.append(self.fd_store)
        for s in self.sessions:
            if s.master_fd is not None:
                found.append(s.master_fd)
        for x in self.execs:
            found += [
                fd
                for fd in (x.stdin_fd, x.stdout_fd, x.stderr_fd, x.control_fd, x.control_listener_fd)
                if fd is not None
            ]
        return found


class _Version(msgspec.Struct):
    version: int


def write(document: Document) -> int:
    """The document in a new memfd (inheritable, at offset 0); the caller passes its number on."""
    data = msgspec.msgpack.encode(document)
    fd = os.memfd_create("aiwg-handover", 0)  # no MFD_CLOEXEC: the new image reads it
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_version(version: int) -> None:
    """Raise :class:`HandoverRefused` unless this code can take over a document of ``version``."""
    if version not in READABLE:
        newer = "newer than" if version > VERSION else "older than"
        raise HandoverRefused(
            f"handover document version {version} is {newer} what this hostd reads ({sorted(READABLE)})"
        )


def read(fd: int) -> Document:
    """Read and close the document at ``fd``: its version is checked before anything else is decoded.
    Raises :class:`HandoverRefused`."""
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise HandoverRefused(f"cannot read the handover document (fd {fd}): {exc}") from exc
    try:
        version = msgspec.msgpack.decode(data, type=_Version).version
    except msgspec.DecodeError as exc:
        raise HandoverRefused(f"the handover document is not one: {exc}") from exc
    check_version(version)
    try:
        return msgspec.msgpack.decode(data, type=Document)
    except msgspec.DecodeError as exc:
        raise HandoverRefused(f"the handover document (version {version}) does not decode: {exc}") from exc


def take_fd(env: dict[str, str] | os._Environ[str]) -> int | None:
    """The document's fd from ``AIWG_HANDOVER_FD``, removed from ``env`` so no child inherits it."""
    raw = env.pop(FD_ENV, None)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise HandoverRefused(f"{FD_ENV}={raw!r} is not an fd number") from None
