"""The event bus's publish API: what an event looks like, what publish refuses, what it bounds."""

from __future__ import annotations

import re

import msgspec
import pytest

from agentic_sandbox.controller.events.bus import MAX_DATA_BYTES, EventBus
from tests.contracts import component, validate


def _last(bus: EventBus) -> dict:
    return msgspec.to_builtins(bus.ring.read(bus.ring.last_seq - 1)[1][0].value)


def test_published_events_are_upstreams_event() -> None:
    bus = EventBus(16)
    seq = bus.publish("task.status_changed", "task/t-1", {"instance_id": "i", "state": "working"})
    assert seq == 1
    event = _last(bus)
    validate(event, component("Event"))
    assert re.match(r"^ev_[0-9A-HJKMNP-TV-Z]{26}$", event["id"])
    assert event["timestamp"].endswith("Z")
    assert (event["kind"], event["subject"], event["data"]) == (
        "task.status_changed",
        "task/t-1",
        {"instance_id": "i", "state": "working"},
    )
    bus.publish("session.attached")
    assert "subject" not in _last(bus) and "data" not in _last(bus)  # both optional in the contract


def test_helpers_shape_the_kinds_in_use() -> None:
    bus = EventBus(16)
    bus.instance_state_changed("i-1", before=None, after="provisioning", cause="operation", operation_id="op_1")
    assert _last(bus)["data"] == {"from": None, "to": "provisioning", "cause": "operation", "operation_id": "op_1"}
    bus.operation_changed("op_1", kind="instance.start", state="failed", instance_id="i-1", error_code="x.y")
    assert _last(bus)["kind"] == "operation.completed" and _last(bus)["data"]["error_code"] == "x.y"
    bus.operation_changed("op_1", kind="instance.start", state="running", instance_id="i-1")
    assert _last(bus)["kind"] == "operation.started"
    bus.storage_written("inbox", "i-1/a", size_bytes=1, sha256="0" * 64, created=True)
    assert _last(bus)["subject"] == "storage/inbox/i-1/a"
    bus.session_exited("s-1", instance_id="i-1", exit_code=0, signal=None, end_reason="exited")
    assert _last(bus)["kind"] == "session.exited"
    bus.instance_removed("i-1", name="n", operation_id=None, reason="decommissioned")
    assert _last(bus)["kind"] == "instance.removed"


def test_kinds_are_dotted_and_data_is_bounded() -> None:
    bus = EventBus(16)
    for bad in ("", "nodot", "Upper.case", "a..b", "a.b-c"):
        with pytest.raises(ValueError):
            bus.publish(bad)
    assert bus.ring.last_seq == 0
    bus.publish("test.big", None, {"blob": "x" * MAX_DATA_BYTES})
    assert _last(bus)["data"] == {"truncated": True}
