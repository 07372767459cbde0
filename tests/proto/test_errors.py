"""Error codes and the client's exception family: stable, distinct wire values with a phrase each,
parsed back (unknown codes are not an error), and the hierarchy callers catch by."""

from __future__ import annotations

import re

import pytest

from agentic_sandbox.proto import errors as e
from agentic_sandbox.proto.errors import ErrorCode, HostdRemoteError, Limit


def test_codes_are_distinct_dotted_values_each_with_a_phrase() -> None:
    values = [code.value for code in ErrorCode]
    assert len(values) == len(set(values)) == len(ErrorCode.__members__)  # no value is an alias
    for code in ErrorCode:
        assert re.fullmatch(r"[a-z_]+\.[a-z_]+", code.value), code
        assert isinstance(code.phrase, str) and code.phrase, code  # type: ignore[attr-defined]


def test_parse_is_the_inverse_of_value_and_none_for_a_code_this_version_does_not_know() -> None:
    for code in ErrorCode:
        assert ErrorCode.parse(code.value) is code
    assert ErrorCode.parse("future.code") is None
    assert ErrorCode.parse("") is None
    assert ErrorCode.parse("INTERNAL") is None  # a member's name is not its value


def test_a_remote_error_carries_its_code_message_and_details() -> None:
    exc = HostdRemoteError("instance.not_found", "no such instance", {"instance_id": "i1"})
    assert str(exc) == "instance.not_found: no such instance"
    assert (exc.code, exc.message, exc.details) == ("instance.not_found", "no such instance", {"instance_id": "i1"})
    assert exc.error_code is ErrorCode.INSTANCE_NOT_FOUND
    bare = HostdRemoteError("future.code", "new")
    assert bare.details == {} and bare.error_code is None


@pytest.mark.parametrize(
    ("cls", "parents"),
    [
        (e.HostdUnavailable, (e.HostdError,)),
        (e.HostdNotRunning, (e.HostdUnavailable, e.HostdError)),
        (e.HostdConnectionLost, (e.HostdUnavailable, e.HostdError)),
        (e.HostdTimeout, (e.HostdError,)),
        (e.HostdProtocolError, (e.HostdError,)),
        (e.HostdVersionMismatch, (e.HostdProtocolError, e.HostdError)),
        (e.HostdRemoteError, (e.HostdError,)),
    ],
)
def test_the_hierarchy_callers_catch_by(cls: type[Exception], parents: tuple[type[Exception], ...]) -> None:
    for parent in parents:
        assert issubclass(cls, parent)
    others = {e.HostdUnavailable, e.HostdTimeout, e.HostdProtocolError, e.HostdRemoteError} - {cls, *parents}
    assert not any(issubclass(cls, other) for other in others)
    assert not issubclass(e.HostdError, (TimeoutError, OSError))  # callers never catch it by accident


def test_a_limit_rides_in_a_refusals_details_and_older_details_name_none() -> None:
    limit = Limit(name="sessions", limit=256, setting="AIWG_MAX_SESSIONS", retry_after_s=5)
    details = {**limit.details(), "retained": 3}  # a refusal may add its own entries
    assert Limit.from_details(details) == limit
    assert Limit.from_details({"name": "checkpoints", "limit": 256}) == Limit(name="checkpoints", limit=256)
    assert Limit.from_details({"limit": 256}) is None  # an older hostd's: which limit is unknown
    assert Limit.from_details({}) is None
