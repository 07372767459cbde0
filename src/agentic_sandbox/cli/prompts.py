"""Answering an agent's question (hitl-prompt/v1) at the terminal, for ``agentic send`` and ``answer``.

A task waiting for input carries the prompt envelope on its status message (the requests activate
the extension): the question, its ``prompt_id`` and the JSON Schema an answer must meet. A schema
that is an object of plain fields (string, boolean, integer, number, possibly an ``enum``) is
asked field by field; any other is asked as one JSON object. What the user types is not checked
here beyond its JSON types: the controller checks it against the schema and its 422 lists what is
wrong, which is shown before asking again.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

HITL_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/hitl-prompt/v1"
SIMPLE_TYPES = ("string", "boolean", "integer", "number")
YES, NO = ("y", "yes", "true", "1"), ("n", "no", "false", "0")


class NoAnswer(Exception):
    """The user gave no answer (end of input)."""


def envelope_of(task: dict[str, Any]) -> dict[str, Any] | None:
    """The prompt a task waits on, if it waits on one."""
    status = task.get("status") or {}
    if status.get("state") != "TASK_STATE_INPUT_REQUIRED":
        return None
    found = ((status.get("message") or {}).get("metadata") or {}).get(HITL_EXTENSION)
    return found if isinstance(found, dict) else None


def answer_message(task: dict[str, Any], prompt_id: str, payload: dict[str, Any], message_id: str) -> dict[str, Any]:
    return {
        "messageId": message_id,
        "role": "ROLE_USER",
        "taskId": task["id"],
        "parts": [{"text": json.dumps(payload)}],
        "metadata": {"hitl_response_for": {"prompt_id": prompt_id, "payload": payload}},
    }


def describe(envelope: dict[str, Any]) -> str:
    """The prompt as lines for a person (``agentic task`` shows it)."""
    lines = [f"prompt   {envelope.get('prompt', '')}", f"id       {envelope.get('prompt_id', '')}"]
    if envelope.get("deadline"):
        lines.append(f"deadline {envelope['deadline']}")
    lines.append(f"answer   {json.dumps(envelope.get('response_schema', {}))}")
    return "\n".join(lines)


def validation_lines(error_body: Any) -> list[str]:
    """``path: message`` for each validation error a 422 lists (any error body is accepted)."""
    error = error_body.get("error") if isinstance(error_body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict) and "validation_errors" in detail:
            return [f"  {e.get('path') or '/'}: {e.get('message', '')}" for e in detail["validation_errors"]]
    return []


def plain_fields(schema: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The schema's properties when each is a plain field (see the module docstring), else None."""
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return None
    for spec in properties.values():
        if not isinstance(spec, dict) or spec.get("type") not in SIMPLE_TYPES:
            return None
    return properties


def _convert(kind: str, text: str) -> Any:
    if kind == "boolean":
        if text.lower() in YES:
            return True
        if text.lower() in NO:
            return False
        raise ValueError("answer y or n")
    if kind == "integer":
        return int(text)
    if kind == "number":
        return float(text)
    return text


class Asker:
    """Asks on ``out`` (stderr: stdout is the agent's) and reads lines from ``read_line``."""

    def __init__(self, read_line: Callable[[], str], out: TextIO = sys.stderr) -> None:
        self.read_line = read_line
        self.out = out

    def _line(self, label: str) -> str:
        self.out.write(label)
        self.out.flush()
        line = self.read_line()
        if not line:
            raise NoAnswer("no answer given (end of input)")
        return line.rstrip("\r\n")

    def ask(self, envelope: dict[str, Any]) -> dict[str, Any]:
        self.out.write(f"? {envelope.get('prompt', '')}\n")
        schema = envelope.get("response_schema") or {}
        fields = plain_fields(schema)
        if fields is None:
            return self._json(schema)
        required = set(schema.get("required") or [])
        payload: dict[str, Any] = {}
        for name, spec in fields.items():
            value = self._field(name, spec, name in required)
            if value is not None:
                payload[name] = value
        return payload

    def _field(self, name: str, spec: dict[str, Any], required: bool) -> Any:
        kind = spec["type"]
        hint = kind + ("" if required else ", optional")
        if isinstance(spec.get("enum"), list):
            hint += ": " + " | ".join(str(v) for v in spec["enum"])
        if spec.get("description"):
            hint += f"; {spec['description']}"
        while True:
            text = self._line(f"  {name} ({hint}): ")
            if not text:
                if not required:
                    return None
                self.out.write(f"  {name} is required\n")
                continue
            try:
                return _convert(kind, text)
            except ValueError as exc:
                self.out.write(f"  not a {kind}: {exc}\n")

    def _json(self, schema: dict[str, Any]) -> dict[str, Any]:
        self.out.write(f"  the answer is a JSON object matching {json.dumps(schema)}\n")
        while True:
            text = self._line("  answer: ")
            try:
                value = json.loads(text)
            except ValueError as exc:
                self.out.write(f"  not JSON: {exc}\n")
                continue
            if isinstance(value, dict):
                return value
            self.out.write("  the answer is a JSON object ({...})\n")


def parse_answer(text: str) -> dict[str, Any]:
    """An answer given on the command line: one JSON object."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--answer {text[:40]!r} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--answer {text[:40]!r} is not a JSON object")
    return value
