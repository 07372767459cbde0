"""Request bodies into types, in memory: msgspec's messages become one field error each, with the
field's path (nested structs, lists, maps) and a code; a body that is not JSON is a 400. The
admin surface's cases over HTTP are in tests/controller/http/test_problems.py."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest

from agentic_sandbox.controller.decoding import decode_json, validation_failure
from agentic_sandbox.controller.errors import MalformedInput, ValidationFailed


class Inner(msgspec.Struct, forbid_unknown_fields=True):
    size: Annotated[int, msgspec.Meta(ge=1)]
    tags: list[str] = []


class Outer(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    inner: Inner | None = None
    items: list[Inner] = []
    by_key: dict[str, Inner] = {}


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        (b"{}", "name", "required"),
        (b'{"name": 1}', "name", "type"),
        (b'{"name": "n", "extra": 1}', "extra", "unknown_field"),
        (b'{"name": "n", "inner": {}}', "inner.size", "required"),
        (b'{"name": "n", "inner": {"size": 0}}', "inner.size", "constraint"),
        (b'{"name": "n", "inner": {"size": 1, "x": 2}}', "inner.x", "unknown_field"),
        (b'{"name": "n", "inner": {"size": 1, "tags": [1]}}', "inner.tags[0]", "type"),
        (b'{"name": "n", "items": [{"size": 1}, {"size": -1}]}', "items[1].size", "constraint"),
        (b'{"name": "n", "items": [{"size": 1}, {}]}', "items[1].size", "required"),
        (b'{"name": "n", "by_key": {"k": {"size": "big"}}}', "by_key[...].size", "type"),
        (b"[]", "$", "type"),
    ],
)
def test_a_body_that_does_not_fit_names_the_field(body: bytes, field: str, code: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        decode_json(body, Outer)
    [error] = caught.value.fields
    assert (error["field"], error["code"]) == (field, code), error
    assert " - at `$" not in error["message"]  # the path went into "field", not the message


@pytest.mark.parametrize("body", [b"", b"{", b'{"name": "n"} trailing', b"\xff"])
def test_a_body_that_is_not_json_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedInput) as caught:
        decode_json(body, Outer)
    [error] = caught.value.fields
    assert (error["field"], error["code"]) == ("$", "json.invalid")
    assert error["message"].startswith("body is not valid JSON: ")


def test_a_fitting_body_decodes() -> None:
    got = decode_json(b'{"name": "n", "items": [{"size": 2, "tags": ["a"]}]}', Outer)
    assert got == Outer(name="n", items=[Inner(size=2, tags=["a"])])


def test_validation_failure_converts_an_error_raised_elsewhere() -> None:
    """Surfaces that decode on their own (JSON-RPC params, push configs) get the same error."""
    with pytest.raises(msgspec.ValidationError) as raised:
        msgspec.convert({"name": "n", "items": [{"size": 0}]}, Outer)
    failure = validation_failure(raised.value)
    assert isinstance(failure, ValidationFailed)
    assert [(e["field"], e["code"]) for e in failure.fields] == [("items[0].size", "constraint")]
