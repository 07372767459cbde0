"""The warm pool file: ``<state_dir>/warm-pools.json`` (0600), every pool's definition and counters.

Rewritten whole at every change (:func:`write`): ``durable`` (a definition changed) syncs it to disk
as the state file does; otherwise (a counter moved) it is only written and renamed into place,
which a killed hostd cannot tear but a machine losing power may undo. A file that cannot be read is
logged and hostd starts without pools (their slots are then removed as leftovers, never handed out
under a definition nobody can see).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec

from agentic_sandbox.proto import messages as m

from .statefile import mkdir_private, write_private

log = logging.getLogger(__name__)


class PoolRecord(msgspec.Struct, kw_only=True):
    """One pool as persisted: its definition and counters."""

    pool: str
    runtime: str
    provider: str
    source: str
    size: int
    template: m.PoolTemplate | None = None
    hits: int = 0
    misses: int = 0
    refills: int = 0
    failures: int = 0
    last_error: str | None = None


class _PoolFile(msgspec.Struct, kw_only=True):
    version: int = 1
    pools: list[PoolRecord] = []


def read(path: Path) -> list[PoolRecord]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        return msgspec.json.decode(raw, type=_PoolFile).pools
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.error("warm pool file %s is unreadable (%s); starting without pools", path, exc)
        return []


def write(path: Path, records: list[PoolRecord], *, durable: bool) -> None:
    """Replace the file (see the module docstring); a failed write is logged, never raised."""
    data = msgspec.json.encode(_PoolFile(pools=records))
    try:
        mkdir_private(path.parent)
        if durable:
            write_private(path, data)
            return
        tmp = path.with_name(f".{path.name}.quick")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:  # a short write (disk full, a size limit) must not rename a cut file in
                written = os.write(fd, view)
                if written <= 0:
                    raise OSError(f"wrote {len(data) - len(view)} of {len(data)} bytes")
                view = view[written:]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        log.error("cannot write warm pool file %s: %s", path, exc)
