"""hostd's state file: every instance, so a restarted hostd can re-adopt what still runs.

``<state_dir>/hostd-state.json`` (0600) holds one :class:`PersistedInstance` per instance. It is
rewritten whole and atomically after each change (:func:`write_private`); a file that cannot be
decoded is moved aside (``hostd-state.json.corrupt-<unix time>``) and hostd starts empty rather
than not at all. What the records mean on reload is :meth:`hostd.instances.InstanceRegistry.load`'s
business.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import msgspec

from agentic_sandbox.proto import messages as m

log = logging.getLogger(__name__)


class PersistedInstance(msgspec.Struct, kw_only=True):
    info: m.InstanceInfo
    #: The request's env (the provider rebuilds what its processes get from it).
    env: dict[str, str] = {}
    #: What the instance's provider keeps to re-adopt it (e.g. the main process's start time, so a
    #: reused pid is never mistaken for it).
    detail: dict[str, object] = {}


#: The state file layout this hostd writes; it reads this one and every older one.
VERSION = 2


class NewerStateFile(Exception):
    """The state file was written by a newer hostd: reading it could lose instances, so hostd refuses
    to start rather than guess (downgrade hostd's package back, or move the file aside by hand)."""


class _StateFile(msgspec.Struct, kw_only=True):
    version: int = VERSION
    instances: list[PersistedInstance] = []


# Version 1 (before runtime providers): host fields on the info itself, the start time beside it.
class _InfoV1(msgspec.Struct, kw_only=True):
    pid: int | None = None
    pgid: int | None = None
    cgroup: str | None = None


class _InstanceV1(msgspec.Struct, kw_only=True):
    info: _InfoV1 = msgspec.field(default_factory=_InfoV1)
    main_create_time: float | None = None


class _StateFileV1(msgspec.Struct, kw_only=True):
    version: int = 1
    instances: list[_InstanceV1] = []


def _upgrade_v1(raw: bytes, state: _StateFile) -> None:
    """Give version-1 records (all host instances) their host detail and saved start time."""
    old = msgspec.json.decode(raw, type=_StateFileV1)
    for new, legacy in zip(state.instances, old.instances, strict=True):
        if new.info.host is None:
            new.info.host = m.HostDetail(pid=legacy.info.pid, pgid=legacy.info.pgid, cgroup=legacy.info.cgroup)
        if legacy.main_create_time is not None:
            new.detail.setdefault("main_create_time", legacy.main_create_time)


def write_private(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``, mode 0600 (tmp + fsync + rename + dir fsync).

    OSError propagates; the caller decides whether a lost write matters.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:  # a short write (disk full, size limit) must not go unnoticed
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def mkdir_private(path: Path) -> None:
    """Create ``path`` (and missing parents) and make it 0700 even if it existed already."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def read(path: Path) -> list[PersistedInstance] | None:
    """The instances recorded in ``path``; None if it does not exist or is corrupt (moved aside, logged).

    A file from a newer hostd raises :class:`NewerStateFile`. Other OSErrors (unreadable file, failing
    rename) propagate.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        state = msgspec.json.decode(raw, type=_StateFile)
        if state.version == 1:
            _upgrade_v1(raw, state)
        elif state.version > VERSION:
            raise NewerStateFile(f"state file {path} has version {state.version}; this hostd reads up to {VERSION}")
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        log.error("state file %s is unreadable (%s); moved it to %s and starting empty", path, exc, aside)
        os.replace(path, aside)
        return None
    return state.instances


def write(path: Path, instances: list[PersistedInstance]) -> None:
    """Replace ``path`` with ``instances`` (creating its dir 0700); a failed write is logged, never raised.

    Small and rare: written synchronously, so writes never interleave or reorder.
    """
    try:
        mkdir_private(path.parent)
        write_private(path, msgspec.json.encode(_StateFile(instances=instances)))
    except OSError as exc:
        # Losing one write must not take hostd down; the next change writes everything again.
        log.error("cannot write state file %s: %s", path, exc)
