"""Answering an agent's question at the terminal, in memory: the prompt a task waits on, the answer
message, a 422's lines, and the asker reading typed lines (field by field, or one JSON object)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentic_sandbox.cli.prompts import (
    HITL_EXTENSION,
    Asker,
    NoAnswer,
    answer_message,
    describe,
    envelope_of,
    parse_answer,
    plain_fields,
    validation_lines,
)

ENVELOPE = {"prompt_id": "p1", "prompt": "Deploy?", "response_schema": {"type": "object"}}


def _waiting(envelope: Any, state: str = "TASK_STATE_INPUT_REQUIRED") -> dict[str, Any]:
    return {"id": "t1", "status": {"state": state, "message": {"metadata": {HITL_EXTENSION: envelope}}}}


def test_envelope_of_a_task_waiting_on_a_prompt() -> None:
    assert envelope_of(_waiting(ENVELOPE)) == ENVELOPE
    assert envelope_of(_waiting(ENVELOPE, "TASK_STATE_WORKING")) is None
    assert envelope_of(_waiting("not a dict")) is None
    assert envelope_of({"status": {"state": "TASK_STATE_INPUT_REQUIRED"}}) is None
    assert envelope_of({"status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": None}}) is None
    assert envelope_of({}) is None


def test_answer_message_carries_the_payload_as_text_and_metadata() -> None:
    msg = answer_message({"id": "t1"}, "p1", {"ok": True}, "m-9")
    assert msg == {
        "messageId": "m-9",
        "role": "ROLE_USER",
        "taskId": "t1",
        "parts": [{"text": '{"ok": true}'}],
        "metadata": {"hitl_response_for": {"prompt_id": "p1", "payload": {"ok": True}}},
    }


def test_describe_shows_the_deadline_only_when_there_is_one() -> None:
    assert describe(ENVELOPE).splitlines() == ["prompt   Deploy?", "id       p1", 'answer   {"type": "object"}']
    assert "deadline 2030-01-01T00:00:00Z" in describe({**ENVELOPE, "deadline": "2030-01-01T00:00:00Z"})


def test_validation_lines_of_any_error_body() -> None:
    body = {
        "error": {
            "details": [
                {"@type": "other"},
                {"validation_errors": [{"path": "/ok", "message": "must be boolean"}, {"message": "bad"}]},
            ]
        }
    }
    assert validation_lines(body) == ["  /ok: must be boolean", "  /: bad"]
    for other in (None, "text", [], {}, {"error": {"details": None}}, {"error": {"details": ["s"]}}):
        assert validation_lines(other) == []


def test_validation_lines_of_an_error_that_is_not_an_object() -> None:
    """The docstring promises any error body (ApiError only carries bodies whose error is an
    object today, so no command met this yet)."""
    assert validation_lines({"error": "x"}) == []
    assert validation_lines({"error": {"details": "not a list"}}) == []


def test_plain_fields_only_for_an_object_of_simple_fields() -> None:
    simple = {"properties": {"a": {"type": "string"}, "b": {"type": "integer", "enum": [1, 2]}}}
    assert plain_fields(simple) == simple["properties"]
    assert plain_fields({"properties": {"a": {"type": "array"}}}) is None
    assert plain_fields({"properties": {"a": "string"}}) is None
    assert plain_fields({"properties": {}}) is None
    assert plain_fields({"type": "object"}) is None


def _asker(*lines: str) -> tuple[Asker, io.StringIO]:
    typed: Iterator[str] = iter([line + "\n" for line in lines])
    out = io.StringIO()
    return Asker(lambda: next(typed, ""), out), out


def test_fields_are_asked_one_by_one_converted_and_asked_again_when_wrong() -> None:
    schema = {
        "type": "object",
        "required": ["ok", "count"],
        "properties": {
            "ok": {"type": "boolean"},
            "count": {"type": "integer", "description": "how many"},
            "ratio": {"type": "number"},
            "colour": {"type": "string", "enum": ["red", "blue"]},
        },
    }
    asker, out = _asker("maybe", "Yes", "", "x", "3", "0.5", "")
    assert asker.ask({**ENVELOPE, "response_schema": schema}) == {"ok": True, "count": 3, "ratio": 0.5}
    shown = out.getvalue()
    assert shown.startswith("? Deploy?\n")
    assert "not a boolean: answer y or n" in shown and "count is required" in shown and "not a integer" in shown
    assert "count (integer; how many): " in shown and "colour (string, optional: red | blue): " in shown


def test_any_other_schema_is_answered_as_one_json_object() -> None:
    asker, out = _asker("not json", "[1]", '{"a": [1]}')
    assert asker.ask({**ENVELOPE, "response_schema": {"type": "object", "properties": {"a": {"type": "array"}}}}) == {
        "a": [1]
    }
    shown = out.getvalue()
    assert "not JSON" in shown and "the answer is a JSON object ({...})" in shown


def test_end_of_input_is_no_answer() -> None:
    asker, _ = _asker()
    with pytest.raises(NoAnswer):
        asker.ask(ENVELOPE)


def test_parse_answer_takes_one_json_object() -> None:
    assert parse_answer('{"ok": false}') == {"ok": False}
    with pytest.raises(ValueError, match="not JSON"):
        parse_answer("{")
    with pytest.raises(ValueError, match="not a JSON object"):
        parse_answer(json.dumps([1]))
