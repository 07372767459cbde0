"""The domain error family: every member has a status at the problem+json edge, the storage and
loadout members keep their bodies, and no service module knows HTTP."""

from __future__ import annotations

import inspect

import pytest

import agentic_sandbox.controller.errors as errors_module
from agentic_sandbox.controller.a2a.errors import BY_CLASS as A2A_BY_CLASS
from agentic_sandbox.controller.a2a.errors import INTERNAL as A2A_INTERNAL
from agentic_sandbox.controller.errors import (
    ControllerError,
    InternalError,
    OperationFailed,
    OutcomeUnknown,
    ValidationFailed,
)
from agentic_sandbox.controller.http.problems import STATUS, to_problem
from agentic_sandbox.controller.loadouts.service import LoadoutExists, LoadoutInvalid
from agentic_sandbox.controller.storage import (
    InvalidPath,
    ObjectNotFound,
    ObjectTooLarge,
    ScopeReadOnly,
    StorageUnavailable,
)


def _family() -> list[type[ControllerError]]:
    return [
        cls
        for _, cls in inspect.getmembers(errors_module, inspect.isclass)
        if issubclass(cls, ControllerError) and cls.__module__ == errors_module.__name__
    ]


def test_every_member_is_drawn_in_the_tree_and_has_a_status() -> None:
    doc = errors_module.__doc__ or ""
    for cls in _family():
        assert cls.__name__ in doc, f"{cls.__name__} is missing from the tree in controller/errors.py"
        assert any(base in STATUS for base in cls.__mro__), cls
    assert OutcomeUnknown not in STATUS  # inherits Unavailable's answer: one table, no repeats


def test_every_member_has_its_own_a2a_answer() -> None:
    """The A2A surface translates the same family once: no member falls through to INTERNAL by
    accident (ControllerError itself and InternalError are the ones that mean it)."""
    for cls in _family():
        kind = next(A2A_BY_CLASS[base] for base in cls.__mro__ if base in A2A_BY_CLASS)
        assert (
            kind is not A2A_INTERNAL or cls in (ControllerError, InternalError) or issubclass(cls, OperationFailed)
        ), cls


@pytest.mark.parametrize(
    ("exc", "status", "body"),
    [
        (
            InvalidPath("path is absolute"),
            422,
            {
                "title": "Validation failed",
                "code": "validation.failed",
                "detail": "path: path is absolute",
                "errors": [{"field": "path", "message": "path is absolute", "code": "path.invalid"}],
            },
        ),
        (
            ScopeReadOnly("global"),
            403,
            {
                "title": "Storage scope is read-only",
                "code": "storage.scope_disabled",
                "detail": "scope 'global' is read-only",
            },
        ),
        (
            ObjectNotFound("inbox", "x/y"),
            404,
            {"title": "Not found", "code": "storage.not_found", "detail": "no object at inbox/x/y"},
        ),
        (
            ObjectTooLarge(2048, 1024),
            413,
            {
                "title": "Object too large",
                "code": "storage.too_large",
                "detail": "object of 2048 bytes exceeds the limit of 1024 bytes",
            },
        ),
        (
            StorageUnavailable("storage root /x is unusable: Permission denied"),
            503,
            {
                "title": "Storage unavailable",
                "code": "storage.unavailable",
                "detail": "storage root /x is unusable: Permission denied",
            },
        ),
        (
            LoadoutInvalid("manifest.command", "Expected `array`, got `str`"),
            422,
            {
                "title": "Validation failed",
                "code": "validation.failed",
                "detail": "manifest.command: Expected `array`, got `str`",
                "errors": [
                    {"field": "manifest.command", "message": "Expected `array`, got `str`", "code": "manifest.invalid"}
                ],
            },
        ),
        (
            LoadoutExists("echo"),
            409,
            {"title": "Conflict", "code": "loadout.already_exists", "detail": "a loadout named 'echo' already exists"},
        ),
    ],
)
def test_storage_and_loadout_errors_keep_their_bodies(exc: ControllerError, status: int, body: dict) -> None:
    problem = to_problem(exc)
    out = problem.body()
    assert out.pop("status") == status
    assert out.pop("type").endswith("/" + body["code"].replace(".", "-").replace("_", "-"))
    assert out == body
    assert problem.headers == {}  # only hostd's 503 invites a quick retry


def test_validation_message_defaults_to_the_first_field() -> None:
    exc = ValidationFailed([{"field": "a", "message": "bad"}, {"field": "b", "message": "worse"}])
    assert (exc.code, exc.message) == ("validation.failed", "a: bad")
    assert ValidationFailed([], "hostd said no").message == "hostd said no"
