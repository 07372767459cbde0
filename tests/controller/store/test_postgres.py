"""The PostgreSQL store on the run's real server: the SQL mapping, migrations by several
controllers at once, a schema newer than the code, and bad days (a server that cannot be reached,
connections cut under the pool) failing closed and recovering by themselves."""

from __future__ import annotations

import time

import pytest
import trio

from agentic_sandbox.controller.errors import Unavailable
from agentic_sandbox.controller.store import SchemaTooNew, Store, StoreClosed, StoreUnavailable
from agentic_sandbox.controller.store.postgres import PgRow, ddl, safe_url, split_statements, translate
from agentic_sandbox.controller.store.schema import STEPS
from tests.controller.store.records import instance
from tests.postgres_service import PgCluster, pgcluster


def test_placeholders_and_percent_signs_are_psycopgs() -> None:
    assert translate("SELECT 1 FROM t WHERE a = ? AND b LIKE '10%'") == "SELECT 1 FROM t WHERE a = %s AND b LIKE '10%%'"
    assert translate("SELECT ?") is translate("SELECT ?")  # once per statement text


def test_column_types_are_mapped_and_dollar_bodies_stay_whole() -> None:
    assert ddl("a REAL NOT NULL, b INTEGER, c BLOB, d TEXT, realm TEXT") == (
        "a DOUBLE PRECISION NOT NULL, b BIGINT, c BYTEA, d TEXT, realm TEXT"
    )
    script = (
        "CREATE TABLE a (x TEXT);\n"
        "CREATE FUNCTION f() RETURNS trigger AS $$\nBEGIN\n  RETURN NULL;\nEND $$ LANGUAGE plpgsql;\n"
    )
    assert split_statements(script) == [
        "CREATE TABLE a (x TEXT);",
        "CREATE FUNCTION f() RETURNS trigger AS $$\nBEGIN\n  RETURN NULL;\nEND $$ LANGUAGE plpgsql;",
    ]


def test_a_row_reads_by_name_and_by_position() -> None:
    row = PgRow(("a", 2), {"name": 0, "count": 1})
    assert row["name"] == "a" and row[1] == 2 and list(row) == ["a", 2] and row.keys() == ["name", "count"]
    (first, second) = row
    assert (first, second) == ("a", 2)


def test_a_url_is_logged_without_its_password() -> None:
    shown = safe_url("postgresql://aiwg:s3cret@db.example:5433/aiwg")
    assert "s3cret" not in shown and shown == "PostgreSQL aiwg@db.example:5433/aiwg"


async def test_controllers_that_start_together_migrate_once(pg_url: str) -> None:
    stores: list[Store] = []

    async def connect() -> None:
        stores.append(await trio.to_thread.run_sync(Store.connect, pg_url))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(connect)
    try:
        version = await stores[0].db.run(lambda db: db.execute("SELECT version FROM schema_version").fetchall())
        assert [tuple(r) for r in version] == [(len(STEPS),)]
        await stores[1].instances.insert(instance("id-a", "alpha"))
        assert (await stores[3].instances.get("id-a")) is not None
    finally:
        for s in stores:
            s.close()


async def test_a_database_newer_than_the_code_is_refused(pg_url: str) -> None:
    store = Store.connect(pg_url)
    await store.db.run(lambda db: db.execute("UPDATE schema_version SET version = 999"))
    store.close()
    with pytest.raises(SchemaTooNew, match="999"):
        Store.connect(pg_url)


def test_a_server_that_does_not_answer_fails_closed_at_start() -> None:
    url = f"postgresql://aiwg@127.0.0.1:{pgcluster.free_port()}/none"
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as raised:
        Store.connect(url, timeout_s=0.5)
    assert isinstance(raised.value, Unavailable) and "did not answer" in raised.value.message
    assert time.monotonic() - started < 5


async def test_connections_cut_under_the_pool_fail_one_call_then_recover(pg_url: str) -> None:
    store = Store.connect(pg_url, min_size=2, max_size=2)
    other = Store.connect(pg_url)
    try:
        await store.instances.insert(instance("id-a", "alpha"))
        cut = await other.db.run(
            lambda db: db.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        )
        assert cut[0] >= 1
        failures = 0
        with trio.fail_after(10):
            while True:
                try:
                    assert (await store.instances.get("id-a")) is not None
                    break
                except StoreUnavailable:
                    failures += 1
        assert failures <= 2  # the pool dropped every broken connection after the first failure
        assert (await store.instances.get("id-a")) is not None
    finally:
        store.close()
        other.close()
    with pytest.raises(StoreClosed):
        await store.instances.get("id-a")


async def test_a_restarted_server_is_used_again_without_a_restart_of_ours(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A server of its own (the run's one is shared by every test): stopped, the store answers 503
    at once rather than hanging; started again, the store answers again, and what was acknowledged
    before is there."""
    cluster = PgCluster().start()
    try:
        store = Store.connect(cluster.create_database("restarted"), timeout_s=1.0)
        await store.instances.insert(instance("id-a", "alpha"))
        await trio.to_thread.run_sync(cluster.stop)
        with pytest.raises(StoreUnavailable):
            await store.instances.get("id-a")
        await trio.to_thread.run_sync(cluster.restart)
        with trio.fail_after(20):
            while True:
                try:
                    found = await store.instances.get("id-a")
                    break
                except StoreUnavailable:
                    await trio.sleep(0.1)
        assert found is not None and found.name == "alpha"
        store.close()
    finally:
        cluster.remove()
