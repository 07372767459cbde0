"""UUIDv7 identifiers: the RFC 9562 layout (version, variant, Unix milliseconds first), time order,
randomness within a millisecond, and the form ``is_uuid`` accepts."""

from __future__ import annotations

import time
import uuid

import pytest

from agentic_sandbox.proto.ids import is_uuid, new_id, uuid7


def test_layout_is_version_7_rfc_variant_with_the_time_in_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    ms = 1_700_000_000_123
    monkeypatch.setattr(time, "time_ns", lambda: ms * 1_000_000 + 999_999)
    value = uuid7()
    assert value.version == 7
    assert value.variant == uuid.RFC_4122
    assert value.int >> 80 == ms
    assert str(value).startswith(f"{ms:012x}"[:8] + "-" + f"{ms:012x}"[8:])


def test_ids_sort_by_time_and_differ_within_a_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_700_000_000_000 * 1_000_000]
    monkeypatch.setattr(time, "time_ns", lambda: clock[0])
    same_ms = {new_id() for _ in range(1000)}
    assert len(same_ms) == 1000  # 74 random bits
    ordered = []
    for _ in range(50):
        clock[0] += 1_000_000
        ordered.append(new_id())
    assert ordered == sorted(ordered)  # the string form sorts like the time


def test_is_uuid_accepts_the_canonical_lowercase_form_only() -> None:
    assert is_uuid(new_id())
    assert is_uuid(str(uuid.uuid4()))
    assert not is_uuid(new_id().upper())
    assert not is_uuid(new_id().replace("-", ""))
    assert not is_uuid("{" + new_id() + "}")
    assert not is_uuid("")


def test_is_uuid_refuses_a_trailing_newline() -> None:
    assert not is_uuid(new_id() + "\n")
