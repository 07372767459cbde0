"""Task metadata as each A2A version spells the keys this project adds."""

from __future__ import annotations

from agentic_sandbox.controller.a2a.caller import WIRE_0_3, WIRE_1_0
from agentic_sandbox.controller.a2a.views import WIRE_KEYS_1_0, wire_metadata
from agentic_sandbox.controller.tasks.agentio import OUTCOME_KEYS, OUTCOME_KEYS_1_0, strip_owned


def test_our_keys_are_camel_case_on_the_1_0_wire_and_upstreams_on_0_3() -> None:
    stored = {
        "fail_kind": "application",
        "exit_code": 3,
        "output_truncated": True,
        "answered_with": "message",
        "agent_protocol": 2,
        "runtime.kind": "host",
        "kagent.dev/a2a/task-created-at": "2026-01-01T00:00:00Z",
        "caller_key": "kept as the caller spelled it",
    }
    shown = wire_metadata(stored, WIRE_1_0)
    assert shown == {
        "failKind": "application",
        "exitCode": 3,
        "outputTruncated": True,
        "answeredWith": "message",
        "agentProtocol": 2,
        "runtime.kind": "host",
        "kagent.dev/a2a/task-created-at": "2026-01-01T00:00:00Z",
        "caller_key": "kept as the caller spelled it",
    }
    assert wire_metadata(stored, WIRE_0_3) is stored
    assert set(WIRE_KEYS_1_0) == OUTCOME_KEYS and set(WIRE_KEYS_1_0.values()) == OUTCOME_KEYS_1_0


def test_a_caller_cannot_set_our_keys_in_either_spelling() -> None:
    assert strip_owned({"exitCode": 0, "exit_code": 0, "failKind": "none", "mine": 1}) == {"mine": 1}


def test_metadata_without_our_keys_is_not_copied() -> None:
    plain = {"runtime.kind": "host"}
    assert wire_metadata(plain, WIRE_1_0) is plain
