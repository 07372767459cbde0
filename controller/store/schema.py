"""The store's schema as ordered migration steps; step ``n`` takes version ``n - 1`` to ``n``.

Append only: a released step never changes (databases in the field ran it as written). A new
kind of record (tasks, events, push configs, signing keys) is a new step creating its tables,
beside a new table module.
"""

from __future__ import annotations

#: Step 1: the schema as it was before versioning (a database made then is stamped version 1).
STEP_1 = """
CREATE TABLE IF NOT EXISTS operations (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    instance_id TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    completed_at REAL,
    result TEXT,
    error TEXT
);
CREATE INDEX IF NOT EXISTS operations_completed ON operations (completed_at);
CREATE TABLE IF NOT EXISTS instances (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    runtime TEXT NOT NULL,
    provider TEXT,
    state TEXT NOT NULL,
    loadout TEXT,
    working_dir TEXT,
    labels TEXT NOT NULL DEFAULT '{}',
    source TEXT,
    note TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
    hash TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    label TEXT NOT NULL,
    source TEXT NOT NULL
);
"""

#: Step 2: the A2A surface's credentials: each instance's bearer token (its SHA-256 digest only)
#: and its AgentCard signing key (raw Ed25519 private key bytes; the database file is 0600).
STEP_2 = """
CREATE TABLE IF NOT EXISTS instance_tokens (
    instance_id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS signing_keys (
    instance_id TEXT PRIMARY KEY,
    kid TEXT NOT NULL UNIQUE,
    private_key BLOB NOT NULL,
    created_at REAL NOT NULL
);
"""

STEPS: tuple[str, ...] = (STEP_1, STEP_2)
