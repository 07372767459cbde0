"""The store's schema as ordered migration steps; step ``n`` takes version ``n - 1`` to ``n``.

Append only: a released step never changes (databases in the field ran it as written). A new
kind of record (tasks, events, push configs, signing keys) is a new step creating its tables,
beside a new table module.

One set of steps for SQLite and PostgreSQL: the SQL is SQLite's, with column types PostgreSQL maps
(:func:`controller.store.postgres.ddl`). What only PostgreSQL has (the triggers that notify other
controllers) is in :data:`POSTGRES_ONLY`, run at the end of its step there.
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

#: Step 3: A2A tasks, each task's ordered event timeline (messages, status and artifact updates,
#: as their A2A JSON) and its artifacts as they stand (chunks folded in).
STEP_3 = """
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    instance_id TEXT NOT NULL,
    context_id TEXT NOT NULL,
    state TEXT NOT NULL,
    status TEXT NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}',
    exec_id TEXT,
    exec_seq INTEGER NOT NULL DEFAULT 0,
    last_seq INTEGER NOT NULL DEFAULT 0,
    last_at REAL NOT NULL,
    created_at REAL NOT NULL,
    status_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_by_instance ON tasks (instance_id, status_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (state);
CREATE TABLE IF NOT EXISTS task_events (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (task_id, seq)
);
CREATE TABLE IF NOT EXISTS task_artifacts (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    artifact_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (task_id, artifact_id)
);
"""

#: Step 4: the idempotency/v1 cache: per instance and binding, the first response to a messageId
#: (status and body bytes as sent) with the hash of the request that produced it.
STEP_4 = """
CREATE TABLE IF NOT EXISTS idempotency_cache (
    instance_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    message_id TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    response_status INTEGER NOT NULL,
    response_body BLOB NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (instance_id, scope, message_id)
);
CREATE INDEX IF NOT EXISTS idempotency_by_created ON idempotency_cache (created_at);
CREATE INDEX IF NOT EXISTS idempotency_by_expiry ON idempotency_cache (expires_at);
"""

#: Step 5: push notification configs of A2A tasks, each with its delivery cursor: the sequence of
#: the last task event delivered (or given up on), so delivery resumes there after a restart.
STEP_5 = """
CREATE TABLE IF NOT EXISTS push_configs (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    instance_id TEXT NOT NULL,
    url TEXT NOT NULL,
    token TEXT,
    auth_scheme TEXT,
    auth_credentials TEXT,
    delivered_seq INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    PRIMARY KEY (task_id, id)
);
"""

#: Step 6: the agent outbox (control messages a task's agent has yet to be handed: follow-ups and
#: hitl-prompt/v1 answers, each stored with the task event it belongs to and removed once hostd took
#: it), and the extensions a push config's request activated (what its deliveries may show).
STEP_6 = """
CREATE TABLE IF NOT EXISTS agent_outbox (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (task_id, seq)
);
ALTER TABLE push_configs ADD COLUMN extensions TEXT NOT NULL DEFAULT '[]';
"""

#: Step 7: what hostd's provider reports of each instance, folded into its row at every reconcile:
#: its capabilities (the AgentCard's and every Task's ``runtime.capabilities``) and the image it
#: runs as resolved (``image_ref``; none for host instances).
STEP_7 = """
ALTER TABLE instances ADD COLUMN capabilities TEXT NOT NULL DEFAULT '[]';
ALTER TABLE instances ADD COLUMN image_ref TEXT;
"""

_UNFINISHED = "state NOT IN ('TASK_STATE_COMPLETED','TASK_STATE_FAILED','TASK_STATE_CANCELED','TASK_STATE_REJECTED')"

#: Step 8: several controllers on one database. A task's exec stream is followed by the controller
#: that owns the task (``owner``) until ``owner_until`` (a lease it renews); a push config is
#: delivered by the controller that owns it the same way. Unfinished tasks are found by an index of
#: their own (a restart, a takeover sweep and a renewal never read the history). A task keeps the id
#: of the message that started it (``message_id``), and an idempotency/v1 entry may be a claim
#: (status -1) held by a controller until ``owner_until``: a retry at another controller finds what
#: the first send made even when the controller that made it died before it could answer. Other
#: claims are rows of ``leases`` by name (a running operation, the one controller that reports
#: hostd's sessions). The admin event
#: stream, in the database when it is shared: ids given in commit order, the same at every
#: controller.
STEP_8 = f"""
ALTER TABLE tasks ADD COLUMN owner TEXT;
ALTER TABLE tasks ADD COLUMN owner_until REAL NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS tasks_unfinished ON tasks (owner, owner_until) WHERE {_UNFINISHED};
ALTER TABLE push_configs ADD COLUMN owner TEXT;
ALTER TABLE push_configs ADD COLUMN owner_until REAL NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN message_id TEXT;
CREATE INDEX IF NOT EXISTS tasks_by_message ON tasks (instance_id, message_id) WHERE message_id IS NOT NULL;
ALTER TABLE idempotency_cache ADD COLUMN owner TEXT;
ALTER TABLE idempotency_cache ADD COLUMN owner_until REAL NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    owner_until REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS admin_events (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    body BLOB NOT NULL
);
"""

#: PostgreSQL's part of step 8: a task's new events, an admin event, a changed instance token and a
#: control message queued for a task's agent are announced on channels every controller listens on
#: (``NOTIFY`` is sent at commit).
POSTGRES_STEP_8 = """
CREATE OR REPLACE FUNCTION aiwg_task_news() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('aiwg_tasks', NEW.id || ' ' || NEW.last_seq);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER tasks_news AFTER INSERT OR UPDATE OF last_seq ON tasks
    FOR EACH ROW EXECUTE FUNCTION aiwg_task_news();
CREATE OR REPLACE FUNCTION aiwg_event_news() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('aiwg_events', NEW.id::text);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER admin_events_news AFTER INSERT ON admin_events
    FOR EACH ROW EXECUTE FUNCTION aiwg_event_news();
CREATE OR REPLACE FUNCTION aiwg_token_news() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('aiwg_tokens', OLD.instance_id);
    ELSE
        PERFORM pg_notify('aiwg_tokens', NEW.instance_id);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER instance_tokens_news AFTER INSERT OR UPDATE OR DELETE ON instance_tokens
    FOR EACH ROW EXECUTE FUNCTION aiwg_token_news();
CREATE OR REPLACE FUNCTION aiwg_outbox_news() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('aiwg_outbox', NEW.task_id);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER agent_outbox_news AFTER INSERT ON agent_outbox
    FOR EACH ROW EXECUTE FUNCTION aiwg_outbox_news();
"""

#: Step 9: costs that stay flat as the history grows. ``task_counts`` holds how many tasks each
#: instance has in each state, kept as tasks are made,
#: change state and are pruned: what ListTasks' ``totalSize`` reads instead of counting rows. Pages
#: filtered by context or state, every instance's tasks by status time (the admin list), by state
#: alone, and the retention's oldest ended tasks each read an index of their own (the old index by
#: state, which gave no order, goes). Those the planner picks by their equalities alone leave the
#: id out (a tie of status times is sorted when read: the id costs 36 bytes a task in each); one
#: whose rival index gives the whole order keeps it, so that it wins (SQLite has no statistics
#: here). Filling the counts reads the history once, here. The admin lists' pages of instances
#: and operations (oldest or newest first, by state or instance) read indexes of their own too.
STEP_9 = """
CREATE TABLE IF NOT EXISTS task_counts (
    instance_id TEXT NOT NULL,
    state TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (instance_id, state)
);
INSERT INTO task_counts SELECT instance_id, state, COUNT(*) FROM tasks GROUP BY instance_id, state;
CREATE INDEX IF NOT EXISTS tasks_by_context ON tasks (context_id, status_at DESC);
CREATE INDEX IF NOT EXISTS tasks_by_instance_state ON tasks (instance_id, state, status_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS tasks_by_status_at ON tasks (status_at DESC);
DROP INDEX IF EXISTS tasks_by_state;
CREATE INDEX IF NOT EXISTS tasks_by_state_at ON tasks (state, status_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS instances_by_created ON instances (created_at, id);
CREATE INDEX IF NOT EXISTS instances_by_state ON instances (state, created_at, id);
CREATE INDEX IF NOT EXISTS operations_by_created ON operations (created_at, id);
CREATE INDEX IF NOT EXISTS operations_by_instance ON operations (instance_id, created_at, id);
CREATE INDEX IF NOT EXISTS operations_by_state ON operations (state, created_at, id);
"""

#: Step 10: several hosts on one store (docs/hosts.md): each host as its controllers last reported
#: it, the controllers that serve it and where peers reach them, the secret controllers sign
#: forwarded requests with, and the host each instance runs on (NULL: a row from before, not placed).
STEP_10 = """
CREATE TABLE IF NOT EXISTS hosts (
    id TEXT PRIMARY KEY,
    boot_id TEXT NOT NULL,
    name TEXT NOT NULL,
    labels TEXT NOT NULL DEFAULT '{}',
    runtimes TEXT NOT NULL DEFAULT '[]',
    capacity TEXT NOT NULL DEFAULT '{}',
    cordoned INTEGER NOT NULL DEFAULT 0,
    draining INTEGER NOT NULL DEFAULT 0,
    registered_at REAL NOT NULL,
    heartbeat_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS host_controllers (
    id TEXT PRIMARY KEY,
    host_id TEXT NOT NULL,
    url TEXT NOT NULL,
    started_at REAL NOT NULL,
    heartbeat_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS host_controllers_by_host ON host_controllers (host_id, heartbeat_at);
CREATE TABLE IF NOT EXISTS cluster_secret (
    id INTEGER PRIMARY KEY,
    secret TEXT NOT NULL,
    created_at REAL NOT NULL
);
ALTER TABLE instances ADD COLUMN host_id TEXT;
CREATE INDEX IF NOT EXISTS instances_by_host ON instances (host_id, state);
"""

#: Step 11: instances that sleep (issue 27): how one sleeps now (JSON, null while awake), its idle
#: policy (JSON), and hostd's counts of its sleeps and wakes (a change is announced once).
STEP_11 = """
ALTER TABLE instances ADD COLUMN sleep TEXT;
ALTER TABLE instances ADD COLUMN idle TEXT;
ALTER TABLE instances ADD COLUMN sleeps INTEGER NOT NULL DEFAULT 0;
ALTER TABLE instances ADD COLUMN wakes INTEGER NOT NULL DEFAULT 0;
"""

#: Step 12: fleet-workload/v1 (issue 28): one row per admitted workload, its whole record (JSON) and
#: its revision beside it for the compare-and-set; the one-row inventory counter every change bumps
#: (no row yet: revision 0, so a new database holds no rows and can take a migrated store).
STEP_12 = """
CREATE TABLE fleet_workloads (
    child_id TEXT PRIMARY KEY,
    orchestrator_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    payload_hash TEXT NOT NULL,
    record TEXT NOT NULL,
    revision INTEGER NOT NULL,
    admitted_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    UNIQUE (orchestrator_id, idempotency_key)
);
CREATE TABLE fleet_inventory (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    revision INTEGER NOT NULL
);
"""

STEPS: tuple[str, ...] = (
    STEP_1,
    STEP_2,
    STEP_3,
    STEP_4,
    STEP_5,
    STEP_6,
    STEP_7,
    STEP_8,
    STEP_9,
    STEP_10,
    STEP_11,
    STEP_12,
)
#: What PostgreSQL runs after a step's common SQL, by step number.
POSTGRES_ONLY: dict[int, str] = {8: POSTGRES_STEP_8}


def postgres_steps() -> tuple[str, ...]:
    return tuple(step + POSTGRES_ONLY.get(number, "") for number, step in enumerate(STEPS, 1))
