"""The A2A input shapes, in memory: camelCase on the wire, unknown fields ignored (A2A §5.7, unlike
the admin inputs), bounds on every list and string, and nothing but what was set written back."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from agentic_sandbox.controller.tasks.model import MAX_PARTS, CancelRequest, Message, SendMessageRequest

USER = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}


def test_camel_case_in_and_out_and_unknown_fields_ignored() -> None:
    body = {
        "message": {**USER, "contextId": "c", "taskId": "t", "referenceTaskIds": ["r"], "fromTheFuture": 1},
        "configuration": {"acceptedOutputModes": ["text/plain"], "historyLength": 3, "returnImmediately": True},
        "tenant": "x",
        "somethingNew": {"a": 1},
    }
    req = msgspec.convert(body, SendMessageRequest)
    assert (req.message.context_id, req.message.task_id, req.message.reference_task_ids) == ("c", "t", ["r"])
    assert req.configuration is not None and req.configuration.history_length == 3
    assert req.configuration.return_immediately and req.configuration.accepted_output_modes == ["text/plain"]
    out = msgspec.to_builtins(req)
    assert out["message"] == {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}], "contextId": "c",
                              "taskId": "t", "referenceTaskIds": ["r"]}  # fmt: skip
    assert "somethingNew" not in out and "fromTheFuture" not in out["message"]


def test_a_part_keeps_only_what_was_set() -> None:
    message = msgspec.convert(
        {**USER, "parts": [{"data": None}, {"url": "http://x/", "mediaType": "text/html"}]}, Message
    )
    # ``data: null`` is data (UNSET is its absence): it survives the round trip.
    assert msgspec.to_builtins(message)["parts"] == [{"data": None}, {"url": "http://x/", "mediaType": "text/html"}]


@pytest.mark.parametrize(
    "change",
    [
        {"messageId": ""},
        {"messageId": "m" * 257},
        {"role": "ROLE_SYSTEM"},
        {"parts": []},
        {"parts": [{"text": "x"}] * (MAX_PARTS + 1)},
        {"parts": [{"url": ""}]},
        {"metadata": {str(i): i for i in range(257)}},
        {"extensions": ["u"] * 65},
    ],
    ids=lambda c: next(iter(c)),
)
def test_a_message_out_of_bounds_is_refused(change: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({**USER, **change}, Message)


@pytest.mark.parametrize("history_length", [-1, 10001])
def test_history_length_is_bounded(history_length: int) -> None:
    with pytest.raises(msgspec.ValidationError, match="historyLength"):
        msgspec.convert({"message": USER, "configuration": {"historyLength": history_length}}, SendMessageRequest)


def test_a_cancel_needs_nothing() -> None:
    assert msgspec.convert({}, CancelRequest) == CancelRequest()
    assert msgspec.convert({"id": "t1", "extra": 1}, CancelRequest).id == "t1"
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"id": ""}, CancelRequest)
