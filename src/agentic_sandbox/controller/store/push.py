"""Push notification configs of A2A tasks, each with its delivery cursor and its claim.

``delivered_seq`` is the sequence of the last task event the config is done with (delivered, or
given up on after its retry budget); delivery resumes after it, so an event stored before a
controller crash is delivered after the restart (at least once: a crash between a receiver's 2xx
and the cursor's write sends that one event again). A config's credentials are stored as given
(the database file is 0600) and never shown back.

Ownership (schema step 8): a config is delivered by one controller at a time, the one whose id is
in ``owner``, until ``owner_until`` unless renewed (all of a controller's claims at once:
:mod:`controller.store.leases`). :meth:`PushTable.create` leaves a config unowned, a replaced one
too: the first controller to :meth:`PushTable.claim` it delivers it (normally the one that made
it, whose worker claims it at once), and a worker delivering the config it replaced, wherever it
runs, finds it is no longer its own. A config whose claim ran out while it has something to
deliver (:meth:`PushTable.orphans`) is claimed by another controller's sweep. A worker writes its
cursor only while the config is still its own (:meth:`PushTable.advance` with ``owner``: False and
nothing written once it was deleted, replaced or taken over), and checks that before each POST
(:meth:`PushTable.hold`); so a controller that stalled past its claim delivers nothing after its
successor started. A config is identified for these checks by ``created_at`` too: the config that
replaced it (a new ``created_at``) is another, even when the same controller claimed it.

Why a conditional ``UPDATE`` and no ``FOR UPDATE SKIP LOCKED``: the claim is one statement whose
``WHERE`` says when it may be taken (ran out, or ours already). Two controllers claiming one row at
once are serialised on its row lock, and PostgreSQL checks the ``WHERE`` again on the row the first
one committed (``READ COMMITTED``), so exactly one of them wins, and the loser waits for one
autocommit statement only. ``SKIP LOCKED`` would spare that wait at the price of a transaction held
from the candidate read to the claim, and SQL that SQLite does not have; the sweep reads its
candidates without locks and claims each of them this way.
"""

from __future__ import annotations

import builtins
from typing import Any

import msgspec

from .database import Connection, Database, from_json, to_json
from .tasks import TERMINAL


class PushConfigRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    task_id: str
    instance_id: str
    url: str
    token: str | None = None
    auth_scheme: str | None = None
    auth_credentials: str | None = None
    delivered_seq: int = 0
    created_at: float
    #: The extensions the request that made it activated (hitl-prompt/v1: its deliveries carry prompts).
    extensions: list[str] = []


def _record(row: Any) -> PushConfigRecord:
    fields = {key: row[key] for key in _FIELDS}
    fields["extensions"] = from_json(fields["extensions"])
    return PushConfigRecord(**fields)


_FIELDS = PushConfigRecord.__struct_fields__
_COLUMNS = ", ".join(("task_id", "id", *(f for f in _FIELDS if f not in ("id", "task_id"))))
#: A config (``p``) with something to deliver, its task being ``t``: events past its cursor, or a
#: task that has not ended (more may come).
_PENDING = f"(p.delivered_seq < t.last_seq OR t.state NOT IN ({','.join(repr(s) for s in TERMINAL)}))"
#: This very config (not one that replaced it), held by this controller.
_MINE = "task_id = ? AND id = ? AND owner = ? AND created_at = ?"


class PushTable:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, rec: PushConfigRecord, *, limit: int) -> bool:
        """Store ``rec`` (replacing a config of the same id), unowned (see the module docstring);
        False if the task has ``limit`` already."""

        def create(db: Connection) -> bool:
            # The task's row, locked: two controllers adding configs at once count one after the other.
            db.execute(f"SELECT id FROM tasks WHERE id = ?{self._db.for_update}", (rec.task_id,))
            count = db.execute(
                "SELECT COUNT(*) FROM push_configs WHERE task_id = ? AND id != ?", (rec.task_id, rec.id)
            ).fetchone()[0]
            if count >= limit:
                return False
            db.execute(
                f"INSERT INTO push_configs ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT (task_id, id) DO UPDATE SET instance_id = excluded.instance_id, url = excluded.url,"
                " token = excluded.token,"
                " auth_scheme = excluded.auth_scheme, auth_credentials = excluded.auth_credentials,"
                " delivered_seq = excluded.delivered_seq, created_at = excluded.created_at,"
                " extensions = excluded.extensions, owner = NULL, owner_until = 0",
                (
                    rec.task_id,
                    rec.id,
                    rec.instance_id,
                    rec.url,
                    rec.token,
                    rec.auth_scheme,
                    rec.auth_credentials,
                    rec.delivered_seq,
                    rec.created_at,
                    to_json(rec.extensions),
                ),
            )
            return True

        return await self._db.run(self._db.transaction(create))

    async def get(self, task_id: str, config_id: str) -> PushConfigRecord | None:
        row = await self._db.run(
            lambda db: db.execute(
                "SELECT * FROM push_configs WHERE task_id = ? AND id = ?", (task_id, config_id)
            ).fetchone()
        )
        return None if row is None else _record(row)

    async def list(self, task_id: str, *, after: str = "", limit: int = 100) -> list[PushConfigRecord]:
        rows = await self._db.run(
            lambda db: db.execute(
                "SELECT * FROM push_configs WHERE task_id = ? AND id > ? ORDER BY id LIMIT ?", (task_id, after, limit)
            ).fetchall()
        )
        return [_record(r) for r in rows]

    async def delete(self, task_id: str, config_id: str) -> None:
        await self._db.run(
            lambda db: db.execute("DELETE FROM push_configs WHERE task_id = ? AND id = ?", (task_id, config_id))
        )

    async def advance(
        self, task_id: str, config_id: str, seq: int, *, owner: str | None = None, created_at: float | None = None
    ) -> bool:
        """The config is done with every event up to ``seq`` (a cursor never moves back). With
        ``owner`` and ``created_at``: only while this very config is that controller's. False
        (nothing written) if there is no such config, or it is not (deleted, replaced, taken)."""
        where, args = "task_id = ? AND id = ?", [seq, seq, task_id, config_id]
        if owner is not None:
            where += " AND owner = ?"
            args.append(owner)
        if created_at is not None:
            where += " AND created_at = ?"
            args.append(created_at)
        cursor = await self._db.quick(
            lambda db: db.execute(
                "UPDATE push_configs SET delivered_seq = CASE WHEN delivered_seq < ? THEN ? ELSE delivered_seq END"
                f" WHERE {where}",
                args,
            )
        )
        return bool(cursor.rowcount == 1)

    async def pending(self) -> builtins.list[PushConfigRecord]:
        """Configs with events to deliver, or whose task may still have some (not ended)."""
        rows = await self._db.run(
            lambda db: db.execute(
                f"SELECT p.* FROM push_configs p JOIN tasks t ON t.id = p.task_id WHERE {_PENDING}"
            ).fetchall()
        )
        return [_record(r) for r in rows]

    # -- ownership (see the module docstring) ---------------------------------------------------

    async def orphans(self, now: float, limit: int = 100) -> builtins.list[PushConfigRecord]:
        """Configs with something to deliver (as :meth:`pending`) whose claim ran out before
        ``now`` (or that nobody claimed yet), oldest first."""
        rows = await self._db.run(
            lambda db: db.execute(
                f"SELECT p.* FROM push_configs p JOIN tasks t ON t.id = p.task_id WHERE p.owner_until < ?"
                f" AND {_PENDING} ORDER BY p.created_at LIMIT ?",
                (now, limit),
            ).fetchall()
        )
        return [_record(r) for r in rows]

    async def claim(
        self, task_id: str, config_id: str, owner: str, until: float, now: float, *, steal: bool = False
    ) -> bool:
        """Make the config ``owner``'s until ``until`` if its claim ran out before ``now`` (or it
        is ``owner``'s already, or ``steal``: the embedded store has one controller, whose
        predecessor is dead); False if another controller holds it, or there is no such config."""
        taken = "" if steal else " AND (owner_until < ? OR owner = ?)"
        args: tuple[Any, ...] = (owner, until, task_id, config_id)
        if not steal:
            args += (now, owner)
        cursor = await self._db.quick(
            lambda db: db.execute(
                f"UPDATE push_configs SET owner = ?, owner_until = ? WHERE task_id = ? AND id = ?{taken}", args
            )
        )
        return bool(cursor.rowcount == 1)

    async def hold(
        self, task_id: str, config_id: str, *, owner: str, created_at: float, need: float, until: float
    ) -> bool:
        """Whether this very config (``created_at``: not one that replaced it) is ``owner``'s, with
        a claim lasting until ``need`` at least: a claim that runs out sooner (its controller's
        renewals fell behind, or stopped) is extended to ``until``, unless another controller took
        it meanwhile. A keyed read while the claim lasts, which is almost always."""
        key = (task_id, config_id, owner, created_at)

        def hold(db: Connection) -> bool:
            row = db.execute(f"SELECT owner_until FROM push_configs WHERE {_MINE}", key).fetchone()
            if row is None:
                return False
            if row[0] >= need:
                return True
            # Ran out, or about to: made good again only while nobody else took it (``owner``
            # is read again under the row's lock).
            return bool(db.execute(f"UPDATE push_configs SET owner_until = ? WHERE {_MINE}", (until, *key)).rowcount)

        return await self._db.quick(hold)

    async def release(self, task_id: str, config_id: str, owner: str) -> None:
        """``owner`` is done with the config (everything delivered): it is renewed no more."""
        await self._db.quick(
            lambda db: db.execute(
                "UPDATE push_configs SET owner = NULL, owner_until = 0 WHERE task_id = ? AND id = ? AND owner = ?",
                (task_id, config_id, owner),
            )
        )
