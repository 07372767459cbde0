"""Bearer token digests by role (never the tokens themselves), replaced per source at start."""

from __future__ import annotations

import msgspec

from .database import Connection, Database


class TokenRecord(msgspec.Struct, frozen=True, kw_only=True):
    hash: str
    role: str
    label: str
    source: str


class TokenTable:
    """Synchronous: read and written at startup only, before serving."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def replace(self, source: str, tokens: list[TokenRecord]) -> None:
        """Replace every token row of ``source`` (e.g. "config") in one transaction."""

        def replace(db: Connection) -> None:
            db.execute("DELETE FROM tokens WHERE source = ?", (source,))
            db.executemany(
                "INSERT INTO tokens VALUES (?,?,?,?) ON CONFLICT (hash) DO UPDATE SET role = excluded.role,"
                " label = excluded.label, source = excluded.source",
                [(t.hash, t.role, t.label, t.source) for t in tokens],
            )

        self._db.locked(self._db.transaction(replace))

    def list(self) -> list[TokenRecord]:
        rows = self._db.locked(lambda db: db.execute("SELECT * FROM tokens ORDER BY source, label").fetchall())
        return [TokenRecord(hash=r["hash"], role=r["role"], label=r["label"], source=r["source"]) for r in rows]
