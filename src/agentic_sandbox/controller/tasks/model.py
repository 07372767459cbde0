"""A2A v1.0 input shapes the task service takes (camelCase on the wire, via ``rename="camel"``).

Unknown fields are ignored, as the spec asks (§5.7); every string, list and map is bounded.
Output is built as plain dicts in A2A JSON (what the store keeps and the surfaces send).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Uri = Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
Metadata = Annotated[dict[str, Any], msgspec.Meta(max_length=256)]
MAX_PARTS = 256


class Part(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """One part: exactly one of ``text``, ``raw`` (base64), ``url``, ``data``."""

    text: str | None = None
    raw: str | None = None
    url: Uri | None = None
    data: Any = msgspec.UNSET
    metadata: Metadata | None = None
    filename: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    media_type: Annotated[str, msgspec.Meta(max_length=256)] | None = None


class Message(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    message_id: Id
    role: Literal["ROLE_USER", "ROLE_AGENT"]
    parts: Annotated[list[Part], msgspec.Meta(min_length=1, max_length=MAX_PARTS)]
    context_id: Id | None = None
    task_id: Id | None = None
    metadata: Metadata | None = None
    extensions: Annotated[list[Uri], msgspec.Meta(max_length=64)] | None = None
    reference_task_ids: Annotated[list[Id], msgspec.Meta(max_length=64)] | None = None


class SendConfiguration(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    accepted_output_modes: Annotated[
        list[Annotated[str, msgspec.Meta(max_length=256)]], msgspec.Meta(max_length=64)
    ] = []
    task_push_notification_config: dict[str, Any] | None = None
    history_length: Annotated[int, msgspec.Meta(ge=0, le=10000)] | None = None
    return_immediately: bool = False


class SendMessageRequest(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    message: Message
    configuration: SendConfiguration | None = None
    metadata: Metadata | None = None
    tenant: Annotated[str, msgspec.Meta(max_length=256)] | None = None


class CancelRequest(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    id: Id | None = None
    metadata: Metadata | None = None
