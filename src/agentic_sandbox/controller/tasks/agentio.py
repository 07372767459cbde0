"""What a task's agent command gets, and the control-channel protocol between it and us.

The agent command (the loadout's ``command``) runs once per task, inside the instance, through
hostd's exec. It gets:

* on **stdin**, the task's first message: its text parts joined by newlines (``raw`` parts as
  their bytes, ``data`` parts as one JSON line each); stdin is then closed;
* in its environment, ``AIWG_TASK_ID``, ``AIWG_CONTEXT_ID`` and ``AIWG_CONTROL_FD``, the number of
  a socket fd carrying JSON objects, one per line, both ways.

What it writes to **stdout** and **stderr** becomes the artifacts ``stdout`` and ``stderr`` as it
arrives (UTF-8; invalid bytes are replaced). Exit status 0 completes the task; any other fails it
(``fail_kind: application``).

The control channel (one JSON object per line, UTF-8, at most 1 MiB a line; docs/writing-an-agent.md lists
every message with examples):

* controller to agent: ``{"type": "message", "message": <A2A Message>}`` for every follow-up
  message to the running task; ``{"type": "input_response", "prompt_id", "payload", "message"}``
  when a client answered the agent's prompt (``payload`` valid against its ``response_schema``;
  at least once: after a controller crash at the wrong moment the same answer may come twice, so
  an agent ignores a ``prompt_id`` it has had); ``{"type": "input_request_invalid", "error",
  "prompt_id"?}`` when an input request cannot become a prompt (the task goes on working).
* agent to controller: ``{"type": "status", "text": "..."}`` (a working status update carrying
  that text as the agent's message); ``{"type": "input_request", "prompt", "response_schema",
  "prompt_id"?, "deadline"?, "allowed_responders"?}`` (hitl-prompt/v1: the task waits for input
  with that prompt, see :mod:`controller.tasks.prompts`; a later ``status`` or ``input_request``
  withdraws it). Other lines are ignored.
"""

from __future__ import annotations

import base64
from typing import Any

import msgspec

from ..errors import TooLarge, ValidationFailed
from .model import Message

MAX_STDIN_BYTES = 1024 * 1024
OWNED_PREFIXES = ("runtime.",)
#: Set on a task when it ends (by the runner), so never at its creation.
OUTCOME_KEYS = frozenset({"fail_kind", "exit_code", "output_truncated", "answered_with", "agent_protocol"})
#: The extensions the send that started the task activated (what its agent's ``task`` line names).
EXTENSIONS = "agentic-sandbox/extensions"
#: The outcome keys as the A2A 1.0 wire spells them (``controller.a2a.views``): a caller's value
#: under that spelling would shadow the controller's.
OUTCOME_KEYS_1_0 = frozenset({"failKind", "exitCode", "outputTruncated", "answeredWith", "agentProtocol"})
OWNED_KEYS = (
    frozenset({"kagent.dev/a2a/timeline-position", "kagent.dev/a2a/task-created-at", EXTENSIONS})
    | OUTCOME_KEYS
    | OUTCOME_KEYS_1_0
)


def strip_owned(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """Caller metadata without the keys the controller owns (it sets its own values)."""
    if metadata is None:
        return None
    return {k: v for k, v in metadata.items() if k not in OWNED_KEYS and not k.startswith(OWNED_PREFIXES)}


def message_dict(msg: Message, *, task_id: str, context_id: str) -> dict[str, Any]:
    """The message as stored: caller-owned metadata only, task and context ids filled in."""
    out: dict[str, Any] = msgspec.to_builtins(msg)
    out["taskId"], out["contextId"] = task_id, context_id
    if msg.metadata is not None:
        out["metadata"] = strip_owned(msg.metadata)
    for index, part in enumerate(msg.parts):
        if part.metadata is not None:
            out["parts"][index]["metadata"] = strip_owned(part.metadata)
    return out


def check_parts(msg: Message) -> None:
    for index, part in enumerate(msg.parts):
        kinds = [k for k in ("text", "raw", "url") if getattr(part, k) is not None]
        if part.data is not msgspec.UNSET:
            kinds.append("data")
        field = f"message.parts[{index}]"
        if len(kinds) != 1:
            raise ValidationFailed(
                [{"field": field, "message": "a part holds exactly one of text, raw, url, data", "code": "oneof"}]
            )
        if kinds == ["url"]:
            raise ValidationFailed(
                [{"field": f"{field}.url", "message": "this agent does not fetch url parts", "code": "unsupported"}]
            )
        if kinds == ["raw"]:
            try:
                base64.b64decode(part.raw or "", validate=True)
            except ValueError:
                raise ValidationFailed(
                    [{"field": f"{field}.raw", "message": "not valid base64", "code": "type"}]
                ) from None


def stdin_of(msg: Message) -> bytes:
    chunks: list[bytes] = []
    for part in msg.parts:
        if part.text is not None:
            chunks.append(part.text.encode())
        elif part.raw is not None:
            chunks.append(base64.b64decode(part.raw))
        elif part.data is not msgspec.UNSET:
            chunks.append(msgspec.json.encode(part.data))
    data = b"\n".join(chunks)
    if len(data) > MAX_STDIN_BYTES:
        raise TooLarge("request.too_large", f"a task's input is at most {MAX_STDIN_BYTES} bytes")
    return data
