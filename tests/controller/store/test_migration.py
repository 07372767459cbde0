"""``agentic-controller migrate-store``: a SQLite store holding a row of every kind, written through the
table APIs, is copied into a fresh database of the run's PostgreSQL server and read back through the
same APIs (claims cleared); a target that holds data, a file in use, a copy that fails half-way and a
server that does not answer leave the target as they found it; the real command, as a subprocess."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agentic_sandbox.controller.store import (
    Append,
    CachedResponse,
    FleetRow,
    HostFacts,
    OperationRecord,
    PushConfigRecord,
    SigningKeyRecord,
    Store,
    TokenRecord,
)
from agentic_sandbox.controller.store.migration import MigrationError, main, migrate_store
from tests.controller.store.records import instance, task
from tests.hostd_process import ROOT

NOW = time.time()
HOUR = 3600.0
KEY = bytes(range(32))
BODY = b"\x00\xff binary answer \x80"


async def fill(path: Path) -> None:
    """A store with a row in every table, through the table APIs (the way a controller writes)."""
    store = Store.open(path)
    try:
        await store.instances.insert(
            instance(
                "i1",
                "one",
                labels={"team": "a"},
                capabilities=["pty"],
                image_ref="img@sha256:1",
                note="n",
                host_id="h1",
            )
        )
        await store.instances.insert(instance("i2", "two", runtime="container", state="stopped", loadout="busybox"))
        await store.operations.save(
            OperationRecord(
                id="op_1",
                kind="instance.provision",
                state="succeeded",
                instance_id="i1",
                created_at=NOW - 10,
                started_at=NOW - 9,
                completed_at=NOW - 8,
                result={"instance_id": "i1"},
            )
        )
        await store.operations.save(OperationRecord(id="op_2", kind="instance.stop", state="running", created_at=NOW))
        store.tokens.replace("config", [TokenRecord(hash="h-admin", role="admin", label="admin", source="config")])
        key = SigningKeyRecord(instance_id="i1", kid="kid-1", private_key=KEY, created_at=NOW)
        await store.credentials.set_identity("i1", "digest-1", key)
        await store.credentials.set_token("i2", "digest-2", NOW)
        first = Append(kind="message", body={"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]})
        # An unfinished task held by the controller that ran on the file, for another hour.
        await store.tasks.create(task("t1", NOW), first, owner="ctl-old", until=NOW + HOUR, message_id="m1")
        working = {"state": "TASK_STATE_WORKING"}
        chunk = {"artifactId": "stdout", "parts": [{"text": "line 1\n"}]}
        more = {"artifactId": "stdout", "parts": [{"text": "line 2\n"}]}
        await store.tasks.append_many(
            "t1",
            [
                Append(kind="status", body={"status": working}, status=working, exec_id="x1", exec_seq=1),
                Append(kind="artifact", body={"artifact": chunk}, artifact=chunk, exec_seq=2),
                Append(kind="artifact", body={"artifact": more}, artifact=more, append=True, exec_seq=3),
                Append(kind="message", body={"messageId": "m2", "parts": []}, outbox={"follow": "up"}),
            ],
            NOW + 1,
        )
        done = {"state": "TASK_STATE_COMPLETED"}
        await store.tasks.create(task("t2", NOW, done, instance_id="i2"), first, owner="ctl-old", until=NOW + HOUR)
        push = PushConfigRecord(
            id="p1",
            task_id="t1",
            instance_id="i1",
            url="https://hooks.example/a2a",
            token="tok",
            auth_scheme="Bearer",
            auth_credentials="secret",
            created_at=NOW,
            extensions=["https://x/ext/v1"],
        )
        assert await store.push.create(push, limit=10)
        await store.push.advance("t1", "p1", 2)
        answer = CachedResponse(request_hash="rh", status=200, body=BODY, created_at=NOW, expires_at=NOW + HOUR)
        await store.idempotency.put("i1", "rest", "m1", answer, max_entries=100)
        claim = await store.idempotency.claim(
            "i1", "jsonrpc", "m9", owner="ctl-old", until=NOW + HOUR, now=NOW, ttl_s=HOUR
        )
        assert claim.value == "mine"
        assert await store.leases.acquire("hostd-watch", "ctl-old", NOW + HOUR, NOW)
        facts = HostFacts(id="h1", boot_id="b1", name="one.example", labels={"zone": "a"}, runtimes=["host"])
        await store.hosts.heartbeat(facts, "ctl-old", "http://127.0.0.1:8080", NOW)
        await store.hosts.set_flags("h1", cordoned=True)
        await store.hosts.secret()
        workload = {"lineage": {"child_id": "c1"}, "status": {"revision": 0}}
        row = FleetRow(
            child_id="c1",
            orchestrator_id="o",
            idempotency_key="k",
            payload_hash="h",
            record=workload,
            revision=0,
            admitted_at=NOW,
            updated_at=NOW,
        )
        await store.fleet.admit(row)
        assert await store.fleet.advance("c1", 0, {**workload, "status": {"revision": 1}})
        # The admin event stream is stored only when the store is shared: no table API writes it here.
        store.db.locked(lambda db: db.execute("INSERT INTO admin_events VALUES (?,?,?)", (7, NOW, b'{"kind":"x"}')))
    finally:
        store.close()


def rows_of(conn: Any, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    quoted = ", ".join(f'"{c}"' for c in columns)
    return sorted((tuple(r) for r in conn.execute(f'SELECT {quoted} FROM "{table}"').fetchall()), key=repr)


def counts(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
            ).fetchall()
        ]
        return {t: int(conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0]) for t in tables}  # type: ignore[index]


async def test_every_row_arrives_and_reads_back_through_the_tables(tmp_path: Path, pg_url: str) -> None:
    path = tmp_path / "controller.db"
    await fill(path)
    seen: list[tuple[str, int]] = []
    done = migrate_store(path, pg_url, batch_rows=2, progress=lambda table, rows: seen.append((table, rows)))
    assert done.skipped == {"leases": 1, "host_controllers": 1}
    assert [t for t, _ in seen] == list(done.copied)
    order = list(done.copied)
    assert order.index("tasks") < order.index("task_events") < order.index("agent_outbox")
    assert order.index("tasks") < order.index("push_configs")
    assert done.copied["task_events"] == 6 and done.copied["instances"] == 2 and done.rows == sum(n for _, n in seen)

    before = Store.open(path)
    after = Store.connect(pg_url)
    try:
        assert await after.instances.list() == await before.instances.list()
        assert await after.hosts.list() == await before.hosts.list()
        assert await after.hosts.controllers() == []  # not copied: each registers again at its start
        assert await after.hosts.secret() == await before.hosts.secret()
        for op_id in ("op_1", "op_2"):
            assert await after.operations.get(op_id) == await before.operations.get(op_id)
        assert [o.id for o in await after.operations.unfinished()] == ["op_2"]
        assert after.tokens.list() == before.tokens.list()
        assert await after.fleet.inventory() == await before.fleet.inventory() != (0, [])
        assert after.credentials.token_digests() == {"i1": "digest-1", "i2": "digest-2"}
        assert await after.credentials.signing_keys() == await before.credentials.signing_keys()
        assert (await after.credentials.signing_key("i1")).private_key == KEY  # type: ignore[union-attr]
        for task_id in ("t1", "t2"):
            assert await after.tasks.get(task_id) == await before.tasks.get(task_id)
            assert await after.tasks.events_after(task_id, 0) == await before.tasks.events_after(task_id, 0)
            assert await after.tasks.snapshot(task_id, None) == await before.tasks.snapshot(task_id, None)
        [stdout] = await after.tasks.artifacts("t1")
        assert stdout["parts"] == [{"text": "line 1\nline 2\n"}]
        assert await after.tasks.by_message("i1", "m1") == await before.tasks.get("t1")
        assert await after.outbox.pending("t1") == await before.outbox.pending("t1")
        assert await after.push.list("t1") == await before.push.list("t1")
        assert (await after.push.get("t1", "p1")).delivered_seq == 2  # type: ignore[union-attr]
        assert await after.idempotency.get("i1", "rest", "m1", NOW) == await before.idempotency.get(
            "i1", "rest", "m1", NOW
        )
        assert (await after.idempotency.get("i1", "rest", "m1", NOW)).body == BODY  # type: ignore[union-attr]
        # The old controller's claims are gone: a new one adopts its unfinished task at once, takes
        # over its idempotency claim and holds its named leases.
        assert [t.id for t in await after.tasks.orphans(time.time())] == ["t1"]
        assert await after.tasks.claim("t1", "ctl-new", NOW + HOUR, time.time())
        claim = await after.idempotency.claim(
            "i1", "jsonrpc", "m9", owner="ctl-new", until=NOW + HOUR, now=time.time(), ttl_s=HOUR
        )
        assert claim.taken_over
        assert await after.leases.held(["hostd-watch"], time.time()) == set()
        assert await after.leases.acquire("hostd-watch", "ctl-new", NOW + HOUR, time.time())
    finally:
        before.close()
        after.close()


async def test_each_table_holds_the_same_rows_but_the_claims(tmp_path: Path, pg_url: str) -> None:
    path = tmp_path / "controller.db"
    await fill(path)
    done = migrate_store(path, pg_url)
    source = sqlite3.connect(path)
    try:
        with psycopg.connect(pg_url) as target:
            for table in done.copied:
                columns = [r[1] for r in source.execute(f'PRAGMA table_info("{table}")')]
                want = rows_of(source, table, columns)
                got = rows_of(target, table, columns)
                if "owner" in columns:
                    assert {r[columns.index("owner")] for r in got} == {None}
                    assert {r[columns.index("owner_until")] for r in got} == {0.0}
                    keep = [i for i, c in enumerate(columns) if c not in ("owner", "owner_until")]
                    want = sorted((tuple(r[i] for i in keep) for r in want), key=repr)
                    got = sorted((tuple(r[i] for i in keep) for r in got), key=repr)
                assert got == want, table
                assert want, f"{table} has no row: the test does not cover it"
    finally:
        source.close()


async def test_a_target_with_data_is_refused_and_left_as_it_was(tmp_path: Path, pg_url: str) -> None:
    path = tmp_path / "controller.db"
    await fill(path)
    other = Store.connect(pg_url)
    try:
        await other.instances.insert(instance("x1", "elsewhere"))
    finally:
        other.close()
    before = counts(pg_url)
    with pytest.raises(MigrationError, match=r"not empty \(instances hold rows\)"):
        migrate_store(path, pg_url)
    assert counts(pg_url) == before
    assert before["instances"] == 1 and before["tasks"] == 0


async def test_a_copy_that_fails_half_way_leaves_the_target_empty(tmp_path: Path, pg_url: str) -> None:
    path = tmp_path / "controller.db"
    await fill(path)
    db = sqlite3.connect(path)  # PostgreSQL's text holds no NUL: the outbox, copied late, fails
    with db:
        db.execute("INSERT INTO agent_outbox VALUES ('t1', 99, ?)", ("nul \x00 here",))
    db.close()
    assert main(["--from", str(path), "--to", pg_url]) == 1
    left = counts(pg_url)
    assert left.pop("schema_version") == 1  # the schema was made (the controller would make it too)
    assert "agent_outbox" in left and set(left.values()) == {0}


async def test_a_file_in_use_or_missing_is_refused_before_anything_is_written(tmp_path: Path, pg_url: str) -> None:
    path = tmp_path / "controller.db"
    await fill(path)
    running = Store.open(path)  # as a controller has it open
    try:
        with pytest.raises(MigrationError, match="in use"):
            migrate_store(path, pg_url)
    finally:
        running.close()
    assert "tasks" not in counts(pg_url)  # not even the schema was made
    with pytest.raises(MigrationError, match="no such file"):
        migrate_store(tmp_path / "nope.db", pg_url)
    assert not (tmp_path / "nope.db").exists()
    (tmp_path / "junk.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(MigrationError, match="not a controller store"):
        migrate_store(tmp_path / "junk.db", pg_url)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``agentic-controller migrate-store ARGS`` as a child process (the entry point's module)."""
    argv = [sys.executable, "-m", "agentic_sandbox.controller.main", "migrate-store", *args]
    base = {k: v for k, v in os.environ.items() if k != "AIWG_DATABASE_URL"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT, env={**base, **(env or {})})


async def test_the_command_migrates_and_says_what_it_copied(tmp_path: Path, pg_url: str) -> None:
    path = tmp_path / "controller.db"
    await fill(path)
    done = command("--from", str(path), env={"AIWG_DATABASE_URL": pg_url})  # the URL from the environment
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "  task_events                   6 rows" in done.stdout
    assert "leases" in done.stdout and "not copied" in done.stdout
    assert "29 rows of 17 tables copied" in done.stdout, done.stdout
    store = Store.connect(pg_url)
    try:
        assert len(await store.instances.list()) == 2
    finally:
        store.close()
    again = command("--from", str(path), "--to", pg_url)
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1 and "not empty" in again.stderr


async def test_the_command_fails_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIWG_DATABASE_URL", raising=False)
    path = tmp_path / "controller.db"
    await fill(path)
    unreachable = f"postgresql://aiwg:hunter2@127.0.0.1:{_free_port()}/nothing"
    failed = command("--from", str(path), "--to", unreachable, "--timeout", "1")
    assert failed.returncode == 1
    assert failed.stderr.count("\n") == 1 and "cannot connect" in failed.stderr, failed.stderr
    assert "hunter2" not in failed.stdout + failed.stderr
    missing = command("--from", str(tmp_path / "nope.db"), "--to", unreachable)
    assert (missing.returncode, missing.stderr.count("\n")) == (1, 1)
    assert not (tmp_path / "nope.db").exists()
    for usage in (["--from", str(path), "--to", "mysql://x/y"], ["--from", str(path)], ["--to", unreachable]):
        with pytest.raises(SystemExit) as exited:
            main(usage)
        assert exited.value.code == 2, usage
