"""Checkpoints on disk: ``<state_dir>/checkpoints/<id>.json`` (the record) beside ``<id>.save``
(the state the provider saved, e.g. a libvirt save image).

A record holds the public :class:`proto.messages.CheckpointInfo` and what its provider needs to
restore it (``detail``). The record is written (0600, atomically) only once the provider saved the
state, and removed when a restore consumed it, so a checkpoint either exists whole or not at all.
At most :data:`MAX_CHECKPOINTS` are kept.
"""

from __future__ import annotations

import builtins
import logging
from pathlib import Path

import msgspec

from agentic_sandbox.proto import ErrorCode, Limit
from agentic_sandbox.proto import messages as m

from .errors import RpcError, limit_reached
from .statefile import mkdir_private, write_private

log = logging.getLogger(__name__)

MAX_CHECKPOINTS = 256


class CheckpointRecord(msgspec.Struct, kw_only=True):
    info: m.CheckpointInfo
    detail: dict[str, object] = {}
    #: hostd made it as a warm pool slot (removed with its pool), rather than being given it.
    pool_made: bool = False


class CheckpointStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def data_path(self, checkpoint_id: str) -> Path:
        return self.directory / f"{checkpoint_id}.save"

    def _record_path(self, checkpoint_id: str) -> Path:
        return self.directory / f"{checkpoint_id}.json"

    def prepare(self, checkpoint_id: str) -> Path:
        """Check that a new checkpoint may be taken; returns where its state goes."""
        if self._record_path(checkpoint_id).exists():
            raise RpcError(
                ErrorCode.REQUEST_INVALID, f"checkpoint {checkpoint_id!r} already exists", checkpoint_id=checkpoint_id
            )
        if len(self.list()) >= MAX_CHECKPOINTS:
            # Fixed, and waiting does not help: checkpoints stay until deleted.
            raise limit_reached(
                f"at most {MAX_CHECKPOINTS} checkpoints are kept; delete some before taking more",
                Limit(name="checkpoints", limit=MAX_CHECKPOINTS),
            )
        mkdir_private(self.directory)
        data = self.data_path(checkpoint_id)
        data.unlink(missing_ok=True)  # left by a save that failed half way
        return data

    def write(self, record: CheckpointRecord) -> None:
        write_private(self._record_path(record.info.checkpoint_id), msgspec.json.encode(record))

    def get(self, checkpoint_id: str) -> CheckpointRecord:
        try:
            return msgspec.json.decode(self._record_path(checkpoint_id).read_bytes(), type=CheckpointRecord)
        except FileNotFoundError:
            raise RpcError(
                ErrorCode.CHECKPOINT_NOT_FOUND, f"no checkpoint {checkpoint_id!r}", checkpoint_id=checkpoint_id
            ) from None

    def list(self) -> builtins.list[m.CheckpointInfo]:
        return [record.info for record in self.records()]

    def records(self) -> builtins.list[CheckpointRecord]:
        out = []
        for path in sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []:
            try:
                out.append(msgspec.json.decode(path.read_bytes(), type=CheckpointRecord))
            except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("skipping unreadable checkpoint record %s: %s", path, exc)
        return out

    def sweep(self) -> None:
        """Remove saved state without a record: a save cut off before its record was written."""
        for data in self.directory.glob("*.save") if self.directory.is_dir() else []:
            if not self._record_path(data.stem).exists():
                log.info("removing %s: a checkpoint that was never completed", data)
                data.unlink(missing_ok=True)

    def remove(self, checkpoint_id: str) -> None:
        self._record_path(checkpoint_id).unlink(missing_ok=True)
        self.data_path(checkpoint_id).unlink(missing_ok=True)
