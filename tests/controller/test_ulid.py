"""ULIDs: 26 Crockford base32 characters, the time in milliseconds first (so ids sort by time, as a
string), 80 random bits after it. The clock is faked: no wait for a millisecond to pass."""

from __future__ import annotations

import re
import time

import pytest

from agentic_sandbox.controller.ulid import new_ulid

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ULID_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")


def _decode(ulid: str) -> int:
    value = 0
    for char in ulid:
        value = value * 32 + CROCKFORD.index(char)
    return value


def test_the_time_in_milliseconds_leads_and_random_bits_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    ms = 1_700_000_000_123
    monkeypatch.setattr(time, "time_ns", lambda: ms * 1_000_000 + 999_999)
    ids = {new_ulid() for _ in range(1000)}
    assert all(ULID_RE.match(i) for i in ids)
    assert {_decode(i) >> 80 for i in ids} == {ms}
    assert len(ids) == 1000  # the same millisecond: the random part tells them apart
    assert len({i[10:] for i in ids}) == 1000


def test_ids_sort_by_time_as_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0]
    monkeypatch.setattr(time, "time_ns", lambda: clock[0])
    ordered = []
    for ms in (0, 1, 31, 32, 1_000, 1_700_000_000_000, 2**48 - 1):
        clock[0] = ms * 1_000_000
        ordered.append(new_ulid())
    assert ordered == sorted(ordered)
    assert ordered[0].startswith("0000000000") and ordered[-1].startswith("7ZZZZZZZZZ")
