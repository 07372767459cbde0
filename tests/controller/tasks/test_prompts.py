"""hitl-prompt/v1's pure logic: envelopes from input requests, answers against their prompt, views."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from agentic_sandbox.controller.errors import Conflict, TooLarge, ValidationFailed
from agentic_sandbox.controller.tasks.prompts import (
    HITL_EXTENSION,
    MAX_DEPTH,
    MAX_PAYLOAD_BYTES,
    Answer,
    PromptInvalid,
    answer_of,
    check_answer,
    envelope_of,
    prompt_message_fields,
    shown,
)
from tests.contracts import hitl_file, validate_hitl

SCHEMA = {"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}}


def request(**fields: Any) -> dict[str, Any]:
    return {"type": "input_request", "prompt": "Go?", "response_schema": SCHEMA, **fields}


def test_an_input_request_becomes_an_envelope_upstream_validates() -> None:
    now = time.time()
    minimal = envelope_of(request(), now)
    assert set(minimal) == {"prompt_id", "prompt", "response_schema"}
    assert uuid.UUID(minimal["prompt_id"]).version == 4
    full = envelope_of(
        request(
            prompt_id="f7d4b1c0-9b25-4e8c-a4ce-3d6a51e8a772",
            deadline="2999-01-01T00:00:00Z",
            allowed_responders=["specific:ops@example.com", "consensus:2"],
            text="ignored: unknown keys are",
        ),
        now,
    )
    for envelope in (minimal, full):
        validate_hitl("envelope", envelope)
    assert full["prompt_id"] == "f7d4b1c0-9b25-4e8c-a4ce-3d6a51e8a772" and "text" not in full
    # Upstream's own example goes through unchanged.
    example = hitl_file("examples/prompt-event.json")["status"]["message"]["metadata"][HITL_EXTENSION]
    assert envelope_of({"type": "input_request", **example}, 0) == example


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x" * 4097}, "prompt"),
        ({"response_schema": {"type": "array"}}, '"type": "object"'),
        ({"response_schema": {"type": "object", "properties": {"a": {"pattern": "(a)\\1"}}}}, "JSON Schema"),
        ({"response_schema": {"type": "object", "$ref": "https://198.51.100.1/x.json"}}, "JSON Schema"),
        ({"response_schema": {"type": "object", "description": "x" * 70000}}, "65536 bytes"),
        ({"deadline": "2001-01-01T00:00:00Z"}, "has passed"),
        ({"deadline": "tomorrow"}, "RFC 3339"),
        ({"deadline": "2999-01-01T00:00:00"}, "RFC 3339"),  # no offset
        ({"prompt_id": "1"}, "prompt_id"),
        ({"allowed_responders": []}, "allowed_responders"),
        ({"allowed_responders": ["consensus:0"]}, "allowed_responders"),
    ],
)
def test_input_requests_that_cannot_be_prompts(fields: dict[str, Any], why: str) -> None:
    with pytest.raises(PromptInvalid, match=r"^input_request: ") as raised:
        envelope_of(request(**fields), time.time())
    assert why in str(raised.value)


def test_answers_are_held_to_their_prompt() -> None:
    envelope = envelope_of(request(), time.time())
    good = Answer(envelope["prompt_id"].upper(), {"a": "yes"})
    check_answer(envelope, good, time.time())  # prompt ids compare in any case
    with pytest.raises(Conflict):
        check_answer(envelope, Answer(str(uuid.uuid4()), {"a": "x"}), time.time())
    with pytest.raises(Conflict):
        check_answer(None, good, time.time())  # the task waits on nothing
    late = envelope_of(request(deadline="2999-01-01T00:00:00+02:00"), time.time())
    with pytest.raises(Conflict, match="expired"):
        check_answer(late, Answer(late["prompt_id"], {"a": "x"}), 40000000000.0)
    with pytest.raises(ValidationFailed) as raised:
        check_answer(envelope, Answer(envelope["prompt_id"], {"b/c": 1}), time.time())
    # Each error names where (a JSON pointer; a missing property is named too) and which keyword.
    assert raised.value.code == "hitl.response_invalid"
    assert sorted((f["field"], f["code"]) for f in raised.value.fields) == [("/a", "required")]
    strict = envelope_of(request(response_schema={**SCHEMA, "additionalProperties": False}), time.time())
    with pytest.raises(ValidationFailed) as raised:
        check_answer(strict, Answer(strict["prompt_id"], {"a": "x", "b/c": 1, "d~": 2}), time.time())
    assert sorted(f["field"] for f in raised.value.fields) == ["/b~1c", "/d~0"]


def test_answers_are_bounded_and_patterns_cannot_backtrack() -> None:
    envelope = envelope_of(request(response_schema={"type": "object"}), time.time())
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(MAX_DEPTH + 5):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(ValidationFailed, match="nested deeper"):
        check_answer(envelope, Answer(envelope["prompt_id"], deep), time.time())
    with pytest.raises(TooLarge):
        check_answer(envelope, Answer(envelope["prompt_id"], {"a": "x" * MAX_PAYLOAD_BYTES}), time.time())
    # A pattern that backtracks exponentially in Python's re is linear here.
    evil = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}
    envelope = envelope_of(request(response_schema=evil), time.time())
    started = time.perf_counter()
    with pytest.raises(ValidationFailed):
        check_answer(envelope, Answer(envelope["prompt_id"], {"a": "a" * 5000 + "!"}), time.time())
    assert time.perf_counter() - started < 5  # re.match would not end in our lifetime


def test_answer_shape_per_response_schema() -> None:
    example = hitl_file("examples/response-message.json")["metadata"]
    validate_hitl("response", example["hitl_response_for"])
    assert answer_of(example) == Answer(**example["hitl_response_for"])
    assert answer_of({"other": 1}) is None and answer_of(None) is None
    for bad in ({"prompt_id": "x", "payload": {}}, {"payload": {}}, {"prompt_id": str(uuid.uuid4()), "payload": []}):
        with pytest.raises(ValidationFailed):
            answer_of({"hitl_response_for": bad})


def test_the_envelope_is_shown_only_when_activated() -> None:
    envelope = envelope_of(request(), time.time())
    message = {"role": "ROLE_AGENT", "parts": [{"text": "Go?"}], **prompt_message_fields(envelope)}
    message["metadata"]["kagent.dev/a2a/timeline-position"] = "t"
    status = {"state": "TASK_STATE_INPUT_REQUIRED", "message": message}
    assert shown(status, True) is status
    bare = shown(status, False)
    assert bare["message"] == {
        "role": "ROLE_AGENT",
        "parts": [{"text": "Go?"}],
        "metadata": {"kagent.dev/a2a/timeline-position": "t"},
    }
    assert HITL_EXTENSION in status["message"]["metadata"]  # the stored status is untouched
    assert shown({"state": "TASK_STATE_WORKING"}, False) == {"state": "TASK_STATE_WORKING"}
