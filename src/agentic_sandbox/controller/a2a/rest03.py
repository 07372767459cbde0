"""The HTTP+JSON binding's A2A 0.3 face: which 0.3 JSON a request gets, and the translation.

A 0.3 request (no ``A2A-Version``, or ``0.3``) is answered in one of two forms of 0.3 JSON:

* ``proto``, 0.3's protobuf JSON (:mod:`.proto03`), on the paths only a2a-sdk 0.3's HTTP+JSON
  transport uses: ``/v1/message:send``, ``/v1/message:stream``, ``/v1/tasks/{id}:cancel``,
  ``/v1/tasks/{id}:subscribe``, ``/v1/card``;
* ``json``, 0.3's JSON with ``kind`` (:mod:`.wire03`), on upstream's ``/v1/`` paths
  (``/v1/messages:send`` ...) and on the standard paths.

Two paths are both upstream's and a2a-sdk's: ``GET /v1/tasks/{id}`` and
``/v1/tasks/{id}/pushNotificationConfigs[/{cid}]``. There a request that shows it comes from
a2a-sdk (it says ``A2A-Version: 0.3``, as a2a-sdk 1.x's 0.3 transport does, or names its
extensions in 0.3's ``X-A2A-Extensions``, as a2a-sdk 0.3 does) gets ``proto``; any other gets
upstream's ``json``. A 1.0 request is answered as it is, untranslated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec
from quart import request

from ..decoding import decode_json
from . import proto03, wire03
from .caller import WIRE_0_3, Caller
from .edge import LEGACY_EXTENSIONS_HEADER
from .streams import Framing

Form = Literal["json", "proto"]
Translate = Callable[[dict[str, Any]], dict[str, Any]]
#: What each answer becomes, by what it is, in each form.
ANSWERS: dict[Form, dict[str, Translate]] = {
    "json": {
        "task": wire03.task_out,
        "send": wire03.send_out,
        "push": wire03.push_config_out,
        "pushes": wire03.push_configs_page_out,
        "tasks": wire03.tasks_page_out,
    },
    "proto": {
        "task": proto03.task_out,
        "send": proto03.send_out,
        "push": proto03.push_config_out,
        "pushes": proto03.push_configs_page_out,
        "tasks": wire03.tasks_page_out,  # ListTasks is not 0.3's: only upstream's /v1/tasks has it
    },
}


def form_of(*, sdk: bool = False, shared: bool = False) -> Form:
    """The 0.3 form of this request (module docstring): ``sdk``, a path only a2a-sdk uses;
    ``shared``, one both it and upstream use."""
    if sdk:
        return "proto"
    if shared and (request.headers.get("A2A-Version") or LEGACY_EXTENSIONS_HEADER in request.headers):
        return "proto"
    return "json"


def answer(caller: Caller, shape: str, body: Any, form: Form = "json") -> Any:
    """``body`` (what the service answered: a ``shape``) as the caller's version has it."""
    if caller.wire != WIRE_0_3:
        return body
    return ANSWERS[form][shape](body)


def send_request(caller: Caller, raw: bytes, form: Form = "json") -> bytes:
    """A send's body as the 1.0 SendMessageRequest JSON the service reads."""
    if caller.wire != WIRE_0_3:
        return raw
    return msgspec.json.encode(proto03.send_in(raw) if form == "proto" else wire03.send_in(decode_json(raw, Any)))


def push_config_request(caller: Caller, raw: bytes, task_id: str, form: Form = "json") -> bytes:
    """A push config's body (0.3: ``{taskId?, pushNotificationConfig}``, or its protobuf form; a
    flat config is taken as it is) as 1.0's, for the task the path names."""
    if caller.wire != WIRE_0_3:
        return raw
    if form == "proto":
        return msgspec.json.encode(proto03.push_config_in(raw, task_id))
    body = decode_json(raw, Any)
    if isinstance(body, dict) and "pushNotificationConfig" in body:
        body = wire03.task_push_config_in(body, task_id)
    return msgspec.json.encode(body)


class Framing03(Framing):
    """A 0.3 stream over HTTP+JSON: each StreamResponse as the form's stream event."""

    def __init__(self, form: Form) -> None:
        self.translate = proto03.stream_out if form == "proto" else wire03.stream_out
        self.form = "0.3-proto" if form == "proto" else "0.3"

    def payload(self, obj: dict[str, Any]) -> bytes:
        return super().payload(self.translate(obj))


def framing(caller: Caller, form: Form = "json") -> Framing | None:
    """The stream framing of the caller's version (``None``: the service's own, 1.0)."""
    return Framing03(form) if caller.wire == WIRE_0_3 else None
