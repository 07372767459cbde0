"""Checkpoints on disk (hostd.checkpoints.CheckpointStore) on a real directory: a checkpoint exists
whole or not at all, records are private, unreadable ones are skipped, the count is bounded."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from agentic_sandbox.hostd import checkpoints
from agentic_sandbox.hostd.checkpoints import CheckpointRecord, CheckpointStore
from agentic_sandbox.hostd.errors import RpcError
from agentic_sandbox.proto import ErrorCode, Limit
from agentic_sandbox.proto import messages as m


def record(checkpoint_id: str, **detail: object) -> CheckpointRecord:
    info = m.CheckpointInfo(
        checkpoint_id=checkpoint_id,
        source_instance_id="src",
        source_name="source",
        runtime="vm",
        provider="libvirt",
        created_at=1.0,
    )
    return CheckpointRecord(info=info, detail=dict(detail))


def take(store: CheckpointStore, checkpoint_id: str) -> CheckpointRecord:
    """What the registry does: prepare, let the provider save, then write the record."""
    store.prepare(checkpoint_id).write_bytes(b"saved state")
    rec = record(checkpoint_id, vm={"uuid": "u"})
    store.write(rec)
    return rec


def test_a_checkpoint_is_its_record_beside_its_state(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoints")
    assert store.list() == [] and store.records() == []  # no directory yet
    rec = take(store, "cp-1")
    assert store.get("cp-1") == rec and store.list() == [rec.info]
    assert store.data_path("cp-1").read_bytes() == b"saved state"
    assert stat.S_IMODE((tmp_path / "checkpoints").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "checkpoints" / "cp-1.json").stat().st_mode) == 0o600


def test_ids_are_single_use_and_unknown_ones_are_not_found(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    take(store, "cp-1")
    with pytest.raises(RpcError) as exists:
        store.prepare("cp-1")
    assert exists.value.code is ErrorCode.REQUEST_INVALID
    with pytest.raises(RpcError) as missing:
        store.get("cp-2")
    assert missing.value.code is ErrorCode.CHECKPOINT_NOT_FOUND and missing.value.details == {"checkpoint_id": "cp-2"}


def test_a_save_cut_off_before_its_record_is_swept_and_prepared_afresh(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    take(store, "whole")
    store.prepare("half").write_bytes(b"half a save")  # hostd died before the record
    assert [r.info.checkpoint_id for r in store.records()] == ["whole"]
    store.sweep()
    assert not store.data_path("half").exists() and store.data_path("whole").exists()
    store.data_path("again").write_bytes(b"left by a failed save")
    assert not store.prepare("again").exists()  # prepare clears it too


def test_remove_takes_record_and_state(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    take(store, "cp-1")
    store.remove("cp-1")
    store.remove("cp-1")  # twice is fine
    assert store.list() == [] and list(tmp_path.iterdir()) == []


def test_an_unreadable_record_is_skipped_not_fatal(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    take(store, "good")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "wrong.json").write_text('{"info": {"checkpoint_id": 1}}')
    assert [info.checkpoint_id for info in store.list()] == ["good"]


def test_the_number_kept_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoints, "MAX_CHECKPOINTS", 2)
    store = CheckpointStore(tmp_path)
    take(store, "a")
    take(store, "b")
    with pytest.raises(RpcError) as full:
        store.prepare("c")
    assert full.value.code is ErrorCode.LIMIT_REACHED
    # A fixed bound (no setting) that waiting does not lift (no retry_after_s).
    assert Limit.from_details(full.value.details) == Limit(name="checkpoints", limit=2)
    store.remove("a")
    assert store.prepare("c") == store.data_path("c")
