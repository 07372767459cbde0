"""The SQLite store on a real file: operations, the instance catalog, tokens, durability, close."""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from pathlib import Path

import pytest
import trio

from controller.store import InstanceRecord, NameTaken, OperationRecord, Store, StoreClosed, TokenRecord


def _instance(iid: str, name: str, **kw: object) -> InstanceRecord:
    now = time.time()
    fields: dict[str, object] = {"runtime": "host", "state": "running", "created_at": now, "updated_at": now}
    fields.update(kw)
    return InstanceRecord(id=iid, name=name, **fields)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path / "db" / "controller.db")
    yield s  # type: ignore[misc]
    s.close()


def test_file_is_private_and_in_wal_mode(store: Store) -> None:
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_operations_round_trip_and_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = Store.open(path)
    op = OperationRecord(id="op_1", kind="instance.provision", state="pending", instance_id="i1", created_at=1.0)
    await store.save_operation(op)
    op.state, op.started_at = "running", 2.0
    await store.save_operation(op)
    done = OperationRecord(
        id="op_2",
        kind="instance.stop",
        state="failed",
        created_at=1.0,
        completed_at=3.0,
        error={"code": "x.y", "status": 503},
        result=None,
    )
    await store.save_operation(done)
    assert [o.id for o in await store.unfinished_operations()] == ["op_1"]
    store.close()

    store = Store.open(path)
    assert await store.get_operation("op_1") == op
    assert (await store.get_operation("op_2")) == done
    assert await store.get_operation("op_nope") is None
    assert await store.purge_operations(completed_before=2.5) == 0
    assert await store.purge_operations(completed_before=3.5) == 1
    assert await store.get_operation("op_2") is None
    assert await store.get_operation("op_1") is not None  # never purged while unfinished
    store.close()


async def test_instance_catalog(store: Store) -> None:
    a = _instance("id-a", "alpha", labels={"team": "x"}, working_dir="/w")
    await store.insert_instance(a)
    await store.insert_instance(_instance("id-b", "beta", state="stopped"))
    with pytest.raises(NameTaken):
        await store.insert_instance(_instance("id-c", "alpha"))
    assert await store.get_instance("id-a") == a
    assert (await store.get_instance_by_name("beta")).id == "id-b"  # type: ignore[union-attr]
    a.state, a.note = "failed", "why"
    await store.update_instance(a)
    assert (await store.get_instance("id-a")).state == "failed"  # type: ignore[union-attr]
    assert [r.name for r in await store.list_instances()] == ["alpha", "beta"]
    assert await store.count_instances_by_state() == {"failed": 1, "stopped": 1}
    assert await store.delete_instance("id-a")
    assert not await store.delete_instance("id-a")
    assert await store.get_instance("id-a") is None


def test_tokens_are_replaced_per_source(store: Store) -> None:
    store.replace_tokens("config", [TokenRecord(hash="aa", role="admin", label="admin", source="config")])
    store.replace_tokens("issued", [TokenRecord(hash="bb", role="operator", label="ci", source="issued")])
    store.replace_tokens("config", [TokenRecord(hash="cc", role="admin", label="admin", source="config")])
    assert {t.hash for t in store.list_tokens()} == {"bb", "cc"}


async def test_concurrent_calls_from_trio(store: Store) -> None:
    async def add(i: int) -> None:
        await store.insert_instance(_instance(f"id-{i}", f"name-{i}"))

    async with trio.open_nursery() as nursery:
        for i in range(40):
            nursery.start_soon(add, i)
    assert len(await store.list_instances()) == 40


async def test_closed_store_refuses(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "c.db")
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreClosed):
        await store.list_instances()


def test_database_and_its_journal_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = Store.open(tmp_path / "state" / "controller.db")
    finally:
        os.umask(old)
    try:
        names = sorted(p.name for p in (tmp_path / "state").iterdir())
        assert "controller.db-wal" in names, names  # open, after the schema was written
        assert (tmp_path / "state").stat().st_mode & 0o077 == 0
        for name in names:
            assert (tmp_path / "state" / name).stat().st_mode & 0o077 == 0, f"{name} is readable by others"
    finally:
        store.close()
