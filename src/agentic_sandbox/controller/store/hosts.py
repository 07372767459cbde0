"""The hosts of a store, the controllers that serve them, and the secret they sign with.

Several hypervisor hosts may share one PostgreSQL database (docs/hosts.md). Each controller reports
its host (:class:`HostFacts`: hostd's host and boot id, labels, runtimes, capacity) and itself
(where its peers reach it) at every heartbeat, in one transaction (:meth:`HostTable.heartbeat`),
so a host's row says when any of its controllers last spoke. What an operator sets on a host
(cordoned, draining) is kept by the heartbeats. On SQLite there is one host and one controller; the
rows are the same.

The cluster secret (:meth:`HostTable.secret`) is made once, by whichever controller asks first, and
read by every other: the key of the signatures on requests one controller forwards to another
(:mod:`controller.hosts.peerauth`). It lives here because the database is already the fleet's root
of trust (it holds every token digest and signing key).
"""

from __future__ import annotations

import builtins
import secrets
import time
from typing import Any

import msgspec

from .database import Connection, Database, from_json, to_json


class HostCapacity(msgspec.Struct, kw_only=True):
    cpus: int = 0
    memory_bytes: int = 0
    memory_available_bytes: int = 0
    #: ``AIWG_HOST_MAX_INSTANCES`` (0: no bound set).
    max_instances: int = 0


class HostFacts(msgspec.Struct, kw_only=True):
    """What a controller reports of its host at each heartbeat."""

    id: str
    boot_id: str
    name: str
    labels: dict[str, str] = {}
    #: The admin runtimes whose hostd provider is available now.
    runtimes: list[str] = []
    capacity: HostCapacity = msgspec.field(default_factory=HostCapacity)


def heard(heartbeat_at: float, now: float, timeout_s: float) -> bool:
    """Whether a heartbeat at ``heartbeat_at`` is recent enough at ``now`` for its sender to count as alive."""
    return now - heartbeat_at <= timeout_s


class HostRecord(HostFacts, kw_only=True):
    """A host's row: its facts as last reported, what an operator set on it, and when."""

    cordoned: bool = False
    draining: bool = False
    registered_at: float
    heartbeat_at: float

    def heard(self, now: float, timeout_s: float) -> bool:
        return heard(self.heartbeat_at, now, timeout_s)


class ControllerRecord(msgspec.Struct, kw_only=True):
    id: str
    host_id: str
    url: str
    started_at: float
    heartbeat_at: float

    def heard(self, now: float, timeout_s: float) -> bool:
        return heard(self.heartbeat_at, now, timeout_s)


def _host(row: Any) -> HostRecord:
    capacity = from_json(row["capacity"]) or {}
    return HostRecord(
        id=row["id"],
        boot_id=row["boot_id"],
        name=row["name"],
        labels=from_json(row["labels"]) or {},
        runtimes=from_json(row["runtimes"]) or [],
        capacity=msgspec.convert(capacity, HostCapacity),
        cordoned=bool(row["cordoned"]),
        draining=bool(row["draining"]),
        registered_at=row["registered_at"],
        heartbeat_at=row["heartbeat_at"],
    )


def _controller(row: Any) -> ControllerRecord:
    return ControllerRecord(
        id=row["id"],
        host_id=row["host_id"],
        url=row["url"],
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"],
    )


class HostTable:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def heartbeat(self, facts: HostFacts, controller_id: str, url: str, now: float) -> HostRecord:
        """Report the host's facts and the controller (``url``: where its peers reach it) in one
        transaction; the host's row as stored, with what an operator set on it. A host's first
        report registers it; the controller keeps its first ``started_at``."""
        host = (
            facts.id,
            facts.boot_id,
            facts.name,
            to_json(facts.labels),
            to_json(facts.runtimes),
            to_json(msgspec.to_builtins(facts.capacity)),
            now,
            now,
        )

        def beat(db: Connection) -> HostRecord:
            db.execute(
                "INSERT INTO hosts (id, boot_id, name, labels, runtimes, capacity, registered_at, heartbeat_at)"
                " VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (id) DO UPDATE SET boot_id = excluded.boot_id,"
                " name = excluded.name, labels = excluded.labels, runtimes = excluded.runtimes,"
                " capacity = excluded.capacity, heartbeat_at = excluded.heartbeat_at",
                host,
            )
            db.execute(
                "INSERT INTO host_controllers (id, host_id, url, started_at, heartbeat_at) VALUES (?,?,?,?,?)"
                " ON CONFLICT (id) DO UPDATE SET host_id = excluded.host_id, url = excluded.url,"
                " heartbeat_at = excluded.heartbeat_at",
                (controller_id, facts.id, url, now, now),
            )
            return _host(db.execute("SELECT * FROM hosts WHERE id = ?", (facts.id,)).fetchone())

        return await self._db.run(self._db.transaction(beat))

    async def get(self, host_id: str) -> HostRecord | None:
        row = await self._db.quick(lambda db: db.execute("SELECT * FROM hosts WHERE id = ?", (host_id,)).fetchone())
        return None if row is None else _host(row)

    async def list(self) -> builtins.list[HostRecord]:
        rows = await self._db.run(lambda db: db.execute("SELECT * FROM hosts ORDER BY registered_at, id").fetchall())
        return [_host(r) for r in rows]

    async def set_flags(
        self, host_id: str, *, cordoned: bool | None = None, draining: bool | None = None
    ) -> HostRecord | None:
        """Cordon or drain a host (or undo it); the row after, None if there is no such host."""

        def flag(db: Connection) -> HostRecord | None:
            for column, value in (("cordoned", cordoned), ("draining", draining)):
                if value is not None:
                    db.execute(f"UPDATE hosts SET {column} = ? WHERE id = ?", (int(value), host_id))
            row = db.execute("SELECT * FROM hosts WHERE id = ?", (host_id,)).fetchone()
            return None if row is None else _host(row)

        return await self._db.run(self._db.transaction(flag))

    async def controllers(
        self, host_id: str | None = None, *, alive_since: float = 0.0
    ) -> builtins.list[ControllerRecord]:
        """Controllers (of ``host_id``, else of every host) heard from since ``alive_since``, newest first."""
        sql = "SELECT * FROM host_controllers WHERE heartbeat_at >= ?"
        args: tuple[Any, ...] = (alive_since,)
        if host_id is not None:
            sql, args = sql + " AND host_id = ?", (alive_since, host_id)
        rows = await self._db.run(lambda db: db.execute(sql + " ORDER BY heartbeat_at DESC, id", args).fetchall())
        return [_controller(r) for r in rows]

    async def forget_controller(self, controller_id: str) -> None:
        """A clean stop: the others stop forwarding to it at once."""
        await self._db.quick(lambda db: db.execute("DELETE FROM host_controllers WHERE id = ?", (controller_id,)))

    async def forget_silent(self, before: float) -> int:
        """Remove controllers not heard from since ``before`` (each start is a new controller id:
        the rows of stopped ones would pile up); how many."""
        cursor = await self._db.run(
            lambda db: db.execute("DELETE FROM host_controllers WHERE heartbeat_at < ?", (before,))
        )
        return int(cursor.rowcount)

    async def forget(self, host_id: str) -> bool:
        """Remove the host and its controllers' rows (the caller checked it is away and empty)."""

        def forget(db: Connection) -> bool:
            db.execute("DELETE FROM host_controllers WHERE host_id = ?", (host_id,))
            return bool(db.execute("DELETE FROM hosts WHERE id = ?", (host_id,)).rowcount == 1)

        return await self._db.run(self._db.transaction(forget))

    async def instance_counts(self) -> dict[str, dict[str, int]]:
        """Catalog rows per host and state (unplaced rows under ``""``), from the host index."""
        rows = await self._db.run(
            lambda db: db.execute("SELECT host_id, state, COUNT(*) FROM instances GROUP BY host_id, state").fetchall()
        )
        counts: dict[str, dict[str, int]] = {}
        for host_id, state, n in rows:
            counts.setdefault(host_id or "", {})[state] = n
        return counts

    async def secret(self) -> bytes:
        """The cluster's secret: made by the first controller that asks, the same for every one after."""
        made = secrets.token_hex(32)

        def get(db: Connection) -> str:
            db.execute(
                "INSERT INTO cluster_secret (id, secret, created_at) VALUES (1, ?, ?) ON CONFLICT (id) DO NOTHING",
                (made, time.time()),
            )
            return str(db.execute("SELECT secret FROM cluster_secret WHERE id = 1").fetchone()[0])

        return bytes.fromhex(await self._db.run(self._db.transaction(get)))
