"""Push notification configs: the A2A ``TaskPushNotificationConfig`` in, checked, stored, shown.

A config belongs to one task of one instance (a task id of another instance is TASK_NOT_FOUND,
as everywhere on the surface). Its URL is checked when it is made (see :mod:`.target`) and again
at each delivery. ``authentication.credentials`` is stored but never shown back.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import msgspec

from agentic_sandbox.proto import new_id

from ..decoding import validation_failure
from ..errors import NotFound, ValidationFailed
from ..store import PushConfigRecord, Store
from ..tasks.model import Id
from .target import check_literal

CONFIG_NOT_FOUND = "push.config_not_found"
#: Configs one task may have.
MAX_CONFIGS_PER_TASK = 16
Secret = Annotated[str, msgspec.Meta(max_length=4096)]


class Authentication(msgspec.Struct, rename="camel", kw_only=True):
    scheme: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")]
    credentials: Annotated[str, msgspec.Meta(max_length=4096, pattern=r"^[\x20-\x7e]*$")] | None = None


class PushConfigIn(msgspec.Struct, rename="camel", kw_only=True):
    url: Annotated[str, msgspec.Meta(max_length=4096)] = ""  # empty or missing: push.invalid_url
    id: Id | None = None
    task_id: Id | None = None
    token: Annotated[str, msgspec.Meta(max_length=4096, pattern=r"^[\x20-\x7e]*$")] | None = None
    authentication: Authentication | None = None
    tenant: Annotated[str, msgspec.Meta(max_length=256)] | None = None


class ConfigRef(msgspec.Struct, rename="camel", kw_only=True):
    task_id: Id
    id: Id
    tenant: str | None = None


class ListParams(msgspec.Struct, rename="camel", kw_only=True):
    task_id: Id
    page_size: Annotated[int, msgspec.Meta(ge=1, le=100)] = 100
    page_token: Annotated[str, msgspec.Meta(max_length=256)] = ""
    tenant: str | None = None


def convert(raw: Any, type_: type[Any]) -> Any:
    try:
        return msgspec.convert(raw, type_, strict=False)
    except msgspec.ValidationError as exc:
        raise validation_failure(exc) from None


def view(rec: PushConfigRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"id": rec.id, "taskId": rec.task_id, "url": rec.url}
    if rec.token is not None:
        out["token"] = rec.token
    if rec.auth_scheme is not None:
        out["authentication"] = {"scheme": rec.auth_scheme}
    return out


def config_not_found(task_id: str, config_id: str) -> NotFound:
    return NotFound(CONFIG_NOT_FOUND, f"task {task_id} has no push notification config {config_id!r}")


class PushConfigs:
    def __init__(self, store: Store, *, allow_private: bool) -> None:
        self.store = store
        self.allow_private = allow_private

    async def create(
        self, instance_id: str, task_id: str, cfg: PushConfigIn, *, from_seq: int, extensions: list[str]
    ) -> PushConfigRecord:
        """Store ``cfg`` for the task; delivery starts after event ``from_seq`` and shows what the
        ``extensions`` activated when it was made allow (hitl-prompt/v1's envelopes)."""
        if cfg.task_id and cfg.task_id != task_id:
            raise ValidationFailed([{"field": "taskId", "message": "differs from the task's id", "code": "mismatch"}])
        check_literal(cfg.url, allow_private=self.allow_private)
        auth = cfg.authentication
        rec = PushConfigRecord(
            id=cfg.id or new_id(),
            task_id=task_id,
            instance_id=instance_id,
            url=cfg.url,
            token=cfg.token,
            auth_scheme=auth.scheme if auth else None,
            auth_credentials=auth.credentials if auth else None,
            delivered_seq=from_seq,
            created_at=time.time(),
            extensions=extensions,
        )
        if not await self.store.push.create(rec, limit=MAX_CONFIGS_PER_TASK):
            raise ValidationFailed(
                [{"field": "taskId", "message": f"a task has at most {MAX_CONFIGS_PER_TASK} push configs"}],
                code="push.too_many_configs",
            )
        return rec

    async def get(self, task_id: str, config_id: str) -> PushConfigRecord:
        rec = await self.store.push.get(task_id, config_id)
        if rec is None:
            raise config_not_found(task_id, config_id)
        return rec

    async def list(self, params: ListParams) -> tuple[list[PushConfigRecord], str]:
        recs = await self.store.push.list(params.task_id, after=params.page_token, limit=params.page_size + 1)
        if len(recs) > params.page_size:
            recs = recs[: params.page_size]
            return recs, recs[-1].id
        return recs, ""

    async def delete(self, task_id: str, config_id: str) -> None:
        await self.store.push.delete(task_id, config_id)  # idempotent (spec §4)
