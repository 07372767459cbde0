"""hitl-prompt/v1: an agent's question to a human, its envelope on the task, and the answer's check.

The agent asks on its control channel (:mod:`controller.tasks.agentio` documents the lines):
:func:`envelope_of` turns its ``input_request`` into the prompt envelope (the shape of upstream's
``envelope.schema.json``: ``prompt_id``, ``prompt``, ``response_schema``, optional ``deadline`` and
``allowed_responders``, nothing else), or raises :class:`PromptInvalid` saying why, which the runner
tells the agent. :func:`prompt_message_fields` is what the ``TASK_STATE_INPUT_REQUIRED`` status
message carries: the envelope in ``metadata`` under the extension's URI, and the URI in
``extensions`` (A2A §4.6.2).

A client answers with a message to the task whose ``metadata.hitl_response_for`` is
``{prompt_id, payload}`` (:func:`answer_of`). :func:`check_answer` holds it against the pending
prompt: an unknown, expired or already answered prompt is 409 ``hitl.already_answered_or_unknown``
(JSON-RPC -32010); a payload the prompt's ``response_schema`` refuses is 422 ``hitl.response_invalid``
(-32011) with one ``{field: <JSON pointer>, code: <keyword>, message}`` per error. Validation is
jsonschema-rs (draft 2020-12): linear-time regular expressions (an agent's schema cannot make a
pattern backtrack for ever), no remote ``$ref`` fetched, payloads at most :data:`MAX_DEPTH` deep and
small enough to reach the agent in one control line; so the check is bounded without a timer.

:func:`shown` takes the envelope off a status for callers that did not activate the extension
(the spec: the envelope appears only when it is activated).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

import jsonschema_rs
import msgspec

from agentic_sandbox.proto import messages as m

from ..decoding import schema_errors
from ..errors import HITL_RESPONSE_INVALID, HITL_UNKNOWN, Conflict, TooLarge, ValidationFailed
from ..store import TaskEvent
from ..store.tasks import HITL_EXTENSION

ANSWER_KEY = "hitl_response_for"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
#: The envelope's bounds (envelope.schema.json, spec §4.3).
MAX_PROMPT_CHARS = 4096
MAX_SCHEMA_BYTES = 64 * 1024
#: Nesting the orchestrator validates (spec: recursion depth 32), for schemas and payloads alike.
MAX_DEPTH = 32
#: An answer goes to the agent as one control line (at most hostd's input bound), with room for
#: the message around it.
MAX_PAYLOAD_BYTES = m.MAX_INPUT_BYTES // 2
UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-5][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$"
RESPONDER_PATTERN = r"^(any|specific:[^\s]+|consensus:[1-9][0-9]*)$"

PromptId = Annotated[str, msgspec.Meta(pattern=UUID_PATTERN)]
Responder = Annotated[str, msgspec.Meta(pattern=RESPONDER_PATTERN, max_length=1024)]


class PromptInvalid(Exception):
    """The agent's input request cannot become a prompt; the message says why (for the agent)."""


class InputRequest(msgspec.Struct, forbid_unknown_fields=False, kw_only=True):
    """The agent's ``{"type": "input_request", ...}`` line (unknown keys ignored, as on every line)."""

    prompt: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_PROMPT_CHARS)]
    response_schema: dict[str, Any]
    prompt_id: PromptId | None = None
    deadline: str | None = None
    allowed_responders: Annotated[list[Responder], msgspec.Meta(min_length=1, max_length=64)] | None = None


class Answer(msgspec.Struct, forbid_unknown_fields=True):
    """``metadata.hitl_response_for`` of a client's answer (response.schema.json: no other keys)."""

    prompt_id: PromptId
    payload: dict[str, Any]


def depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a JSON value, counted up to ``limit + 1`` (no deeper walk than that)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    deepest = 0
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            level += 1
            deepest = max(deepest, level)
            if level > limit:
                return level
            stack.extend((child, level) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _validator(schema: dict[str, Any]) -> Any:
    return jsonschema_rs.Draft202012Validator(schema, offline=True, pattern_options=jsonschema_rs.RegexOptions())


def parse_deadline(text: str) -> datetime:
    stamp = datetime.fromisoformat(text.replace("z", "Z"))
    if stamp.tzinfo is None:
        raise ValueError("no UTC offset")
    return stamp


def envelope_of(line: dict[str, Any], now: float) -> dict[str, Any]:
    """The prompt envelope for an agent's ``input_request`` line, or :class:`PromptInvalid`."""
    try:
        req = msgspec.convert(line, InputRequest)
    except msgspec.ValidationError as exc:
        raise PromptInvalid(f"input_request: {exc}") from None
    schema = req.response_schema
    if schema.get("type") != "object":
        raise PromptInvalid('input_request: response_schema must declare "type": "object" at its top level')
    if len(msgspec.json.encode(schema)) > MAX_SCHEMA_BYTES:
        raise PromptInvalid(f"input_request: response_schema is larger than {MAX_SCHEMA_BYTES} bytes")
    if depth(schema) > MAX_DEPTH * 2:
        raise PromptInvalid(f"input_request: response_schema is nested deeper than {MAX_DEPTH * 2} levels")
    try:
        _validator(schema)
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        first = str(exc).split("\n", 1)[0]
        raise PromptInvalid(f"input_request: response_schema is not a usable JSON Schema: {first}") from None
    envelope: dict[str, Any] = {
        "prompt_id": req.prompt_id or str(uuid.uuid4()),
        "prompt": req.prompt,
        "response_schema": schema,
    }
    if req.deadline is not None:
        try:
            deadline = parse_deadline(req.deadline)
        except ValueError:
            raise PromptInvalid(f"input_request: deadline {req.deadline[:64]!r} is not an RFC 3339 time") from None
        if deadline.timestamp() <= now:
            raise PromptInvalid(f"input_request: deadline {req.deadline[:64]} has passed")
        envelope["deadline"] = req.deadline
    if req.allowed_responders is not None:
        envelope["allowed_responders"] = req.allowed_responders
    return envelope


def prompt_message_fields(envelope: dict[str, Any]) -> dict[str, Any]:
    """What the INPUT_REQUIRED status message carries besides its text (the prompt)."""
    return {"metadata": {HITL_EXTENSION: envelope}, "extensions": [HITL_EXTENSION]}


def pending(state: str, status: dict[str, Any]) -> dict[str, Any] | None:
    """The envelope of the prompt a task waits on, if it waits on one."""
    if state != INPUT_REQUIRED:
        return None
    metadata = (status.get("message") or {}).get("metadata") or {}
    envelope = metadata.get(HITL_EXTENSION)
    return envelope if isinstance(envelope, dict) else None


def answer_of(metadata: dict[str, Any] | None) -> Answer | None:
    """The answer a message carries (``metadata.hitl_response_for``), None if it carries none."""
    if metadata is None or ANSWER_KEY not in metadata:
        return None
    try:
        return msgspec.convert(metadata[ANSWER_KEY], Answer)
    except msgspec.ValidationError as exc:
        where = str(exc).rsplit(" - at `$", 1)
        field = f"message.metadata.{ANSWER_KEY}" + (where[1].rstrip("`") if len(where) == 2 else "")
        raise ValidationFailed([{"field": field, "message": where[0], "code": "invalid"}]) from None


def unknown_prompt(prompt_id: str, why: str) -> Conflict:
    return Conflict(
        HITL_UNKNOWN,
        f"hitl_already_answered_or_unknown: {why}",
        details={"extension": HITL_EXTENSION, "prompt_id": prompt_id},
    )


def validation_errors(schema: dict[str, Any], payload: dict[str, Any]) -> list[dict[str, str]]:
    """``{field: JSON pointer, code: keyword, message}`` for each way ``payload`` breaks ``schema``."""
    return schema_errors(_validator(schema), payload)


def check_answer(envelope: dict[str, Any] | None, answer: Answer, now: float) -> None:
    """Raise unless ``answer`` answers the pending prompt ``envelope`` validly (see the module docstring)."""
    if envelope is None or envelope.get("prompt_id", "").lower() != answer.prompt_id.lower():
        raise unknown_prompt(answer.prompt_id, f"the task waits on no prompt {answer.prompt_id} (unknown or answered)")
    deadline = envelope.get("deadline")
    if deadline is not None and parse_deadline(deadline).timestamp() <= now:
        raise unknown_prompt(answer.prompt_id, f"prompt {answer.prompt_id} expired at {deadline}")
    if len(msgspec.json.encode(answer.payload)) > MAX_PAYLOAD_BYTES:
        raise TooLarge("request.too_large", f"an answer's payload is at most {MAX_PAYLOAD_BYTES} bytes")
    if depth(answer.payload) > MAX_DEPTH:
        errors = [{"field": "", "code": "maxDepth", "message": f"the payload is nested deeper than {MAX_DEPTH}"}]
    else:
        errors = validation_errors(envelope["response_schema"], answer.payload)
    if errors:
        raise ValidationFailed(
            errors,
            f"hitl_response_invalid: the payload does not match the prompt's response_schema "
            f"({len(errors)} error{'s' if len(errors) > 1 else ''}; first: {errors[0]['field'] or '/'}: "
            f"{errors[0]['message']})",
            code=HITL_RESPONSE_INVALID,
            details={"extension": HITL_EXTENSION, "prompt_id": answer.prompt_id},
        )


def shown(status: dict[str, Any], active: bool) -> dict[str, Any]:
    """``status`` as a caller sees it: without the envelope unless it activated the extension."""
    message = status.get("message")
    if active or not message or HITL_EXTENSION not in (message.get("metadata") or {}):
        return status
    metadata = {k: v for k, v in message["metadata"].items() if k != HITL_EXTENSION}
    bare = {k: v for k, v in message.items() if k not in ("metadata", "extensions")}
    if metadata:
        bare["metadata"] = metadata
    extensions = [uri for uri in message.get("extensions") or [] if uri != HITL_EXTENSION]
    if extensions:
        bare["extensions"] = extensions
    return {**status, "message": bare}


def shown_event(event: TaskEvent, active: bool) -> dict[str, Any]:
    """A status or artifact update's body as a reader sees it (see :func:`shown`); the stored
    body itself is never changed."""
    if event.kind == "status" and not active:
        return {**event.body, "status": shown(event.body["status"], False)}
    return event.body


def activated(extensions: list[str]) -> bool:
    """Whether these activated extensions (a request's, a push config's) include hitl-prompt/v1."""
    return any(uri.lower() == HITL_EXTENSION.lower() for uri in extensions)
