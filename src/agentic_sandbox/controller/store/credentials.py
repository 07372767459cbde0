"""Per-instance credentials of the A2A surface: bearer token digests and AgentCard signing keys.

A token is kept as its SHA-256 digest only (the token itself is shown once, when it is issued); a
new token for an instance replaces the old one. A signing key is the raw 32-byte Ed25519 private
key, made once per instance and kept for its lifetime (the card's signature stays verifiable with
the published JWKS); the database file is 0600, like every secret file of the controller.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .database import Connection, Database

_SET_TOKEN = (
    "INSERT INTO instance_tokens VALUES (?,?,?)"
    " ON CONFLICT (instance_id) DO UPDATE SET hash = excluded.hash, created_at = excluded.created_at"
)
_ADD_KEY = "INSERT INTO signing_keys VALUES (?,?,?,?) ON CONFLICT DO NOTHING"


class SigningKeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    kid: str
    private_key: bytes
    created_at: float


class CredentialTable:
    def __init__(self, db: Database) -> None:
        self._db = db

    # -- tokens ---------------------------------------------------------------------------------

    async def set_token(self, instance_id: str, digest: str, created_at: float) -> None:
        await self._db.run(lambda db: db.execute(_SET_TOKEN, (instance_id, digest, created_at)))

    async def set_identity(self, instance_id: str, digest: str, key: SigningKeyRecord) -> None:
        """A new instance's token digest and signing key, in one transaction (one round trip)."""

        def store(db: Connection) -> None:
            db.execute(_SET_TOKEN, (instance_id, digest, key.created_at))
            db.execute(
                _ADD_KEY,
                (key.instance_id, key.kid, key.private_key, key.created_at),
            )

        await self._db.run(self._db.transaction(store))

    def token_digests(self) -> dict[str, str]:
        """Every instance's token digest, by instance id (read at start, before serving)."""
        rows = self._db.locked(lambda db: db.execute("SELECT instance_id, hash FROM instance_tokens").fetchall())
        return {row["instance_id"]: row["hash"] for row in rows}

    async def token_digest(self, instance_id: str) -> str | None:
        row = await self._db.quick(
            lambda db: db.execute("SELECT hash FROM instance_tokens WHERE instance_id = ?", (instance_id,)).fetchone()
        )
        return None if row is None else str(row[0])

    async def all_token_digests(self) -> dict[str, str]:
        rows = await self._db.run(lambda db: db.execute("SELECT instance_id, hash FROM instance_tokens").fetchall())
        return {row[0]: row[1] for row in rows}

    async def forget(self, instance_id: str) -> None:
        """Drop an instance's token and key (it was decommissioned)."""

        def forget(db: Connection) -> None:
            db.execute("DELETE FROM instance_tokens WHERE instance_id = ?", (instance_id,))
            db.execute("DELETE FROM signing_keys WHERE instance_id = ?", (instance_id,))

        await self._db.run(self._db.transaction(forget))

    # -- signing keys ---------------------------------------------------------------------------

    async def signing_key(self, instance_id: str) -> SigningKeyRecord | None:
        row = await self._db.run(
            lambda db: db.execute("SELECT * FROM signing_keys WHERE instance_id = ?", (instance_id,)).fetchone()
        )
        return None if row is None else _key(row)

    async def add_signing_key(self, rec: SigningKeyRecord) -> SigningKeyRecord:
        """Insert the key unless the instance has one already; returns the one that is kept."""

        def add(db: Connection) -> Any:
            db.execute(
                _ADD_KEY,
                (rec.instance_id, rec.kid, rec.private_key, rec.created_at),
            )
            return db.execute("SELECT * FROM signing_keys WHERE instance_id = ?", (rec.instance_id,)).fetchone()

        return _key(await self._db.run(self._db.transaction(add)))

    async def signing_keys(self) -> list[SigningKeyRecord]:
        rows = await self._db.run(lambda db: db.execute("SELECT * FROM signing_keys ORDER BY kid").fetchall())
        return [_key(r) for r in rows]


def _key(row: Any) -> SigningKeyRecord:
    return SigningKeyRecord(
        instance_id=row["instance_id"],
        kid=row["kid"],
        private_key=bytes(row["private_key"]),
        created_at=row["created_at"],
    )
