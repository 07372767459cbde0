"""Page tokens and page sizes in memory: a token reads back only in its own list with its own
filters; anything else, and every limit outside 1..MAX_PAGE_SIZE, is a 400 naming the parameter."""

from __future__ import annotations

import base64

import msgspec
import pytest

from agentic_sandbox.controller.admin.paging import (
    MAX_PAGE_SIZE,
    decode_token,
    encode_token,
    narrowed_to,
    page_size,
)
from agentic_sandbox.controller.auth.tokens import Principal
from agentic_sandbox.controller.errors import MalformedInput


def test_a_token_round_trips_its_key_exactly() -> None:
    assert decode_token(encode_token("x", {}, (3, "a")), "x", {}) == (3.0, "a")
    for key in ((1.0, "a"), (1778000000.123456, "op_01J"), (0.1 + 0.2, "é/=?")):
        token = encode_token("instances", {"state": None, "label": ["a=b"]}, key)
        assert "=" not in token and "+" not in token and "/" not in token
        assert decode_token(token, "instances", {"label": ["a=b"], "state": None}) == key


def test_no_token_or_an_empty_one_is_the_first_page() -> None:
    assert decode_token(None, "tasks", {}) is None
    assert decode_token("", "tasks", {}) is None


def _field(exc: pytest.ExceptionInfo[MalformedInput]) -> str:
    return exc.value.fields[0]["field"]


@pytest.mark.parametrize(
    "token",
    [
        "not base64 at all!",
        "AAAA",  # bytes, not JSON
        base64.urlsafe_b64encode(b'{"a": 1}').decode(),
        base64.urlsafe_b64encode(msgspec.json.encode(["instances", "x", "y", "check"])).decode(),
        "é",
    ],
)
def test_a_token_that_does_not_read_back_is_a_400(token: str) -> None:
    with pytest.raises(MalformedInput) as exc:
        decode_token(token, "instances", {})
    assert _field(exc) == "page_token"


def test_a_token_of_another_list_other_filters_or_edited_is_a_400() -> None:
    token = encode_token("instances", {"state": "running"}, (5.0, "b"))
    for kind, filters in (("operations", {"state": "running"}), ("instances", {"state": "stopped"})):
        with pytest.raises(MalformedInput) as exc:
            decode_token(token, kind, filters)
        assert _field(exc) == "page_token"
    data = msgspec.json.decode(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    data[1] = 4.0  # an earlier start, check left as it was
    edited = base64.urlsafe_b64encode(msgspec.json.encode(data)).rstrip(b"=").decode()
    with pytest.raises(MalformedInput):
        decode_token(edited, "instances", {"state": "running"})


def test_page_size_bounds() -> None:
    assert page_size(None) is None
    assert page_size(None, default=100) == 100
    assert page_size("1") == 1
    assert page_size(str(MAX_PAGE_SIZE)) == MAX_PAGE_SIZE
    for raw in ("0", "-1", "+5", " 5", "\u0663", str(MAX_PAGE_SIZE + 1), "", "ten", "1.5", "0x10"):
        with pytest.raises(MalformedInput) as exc:
            page_size(raw, default=100)
        assert _field(exc) == "limit"


def test_an_instance_token_is_narrowed_to_its_instance() -> None:
    assert narrowed_to(Principal(role="instance", label="i", instance_id="i1")) == "i1"
    assert narrowed_to(Principal(role="operator", label="o")) is None
    assert narrowed_to(Principal(role="admin", label="a")) is None
