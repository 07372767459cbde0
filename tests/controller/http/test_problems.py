"""problem+json: the envelope, field-naming validation errors, and the translation at the edge."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import msgspec
import pytest
import trio
from quart import Blueprint
from quart_trio import QuartTrio

from agentic_sandbox.controller.app import create_app
from agentic_sandbox.controller.config import load_config
from agentic_sandbox.controller.decoding import decode_json
from agentic_sandbox.controller.errors import ControllerError, OutcomeUnknown, Unauthenticated
from agentic_sandbox.controller.hostlink import hostd_failure
from agentic_sandbox.controller.http.problems import (
    PROBLEM_MEDIA_TYPE,
    Problem,
    install_problem_handlers,
    problem_type,
    to_problem,
)
from agentic_sandbox.controller.models import ProvisionRequest
from agentic_sandbox.proto import (
    HostdConnectionLost,
    HostdNotRunning,
    HostdProtocolError,
    HostdRemoteError,
    HostdTimeout,
    Limit,
)
from tests.contracts import validate_problem

from ..conftest import ADMIN_TOKEN, LiveController, controller_env

#: Our stricter reading of contracts/admin-api/error-envelope.schema.json (code and trace_id
#: patterns); every problem is also validated against the contract file itself.
ENVELOPE = {
    "type": "object",
    "required": ["type", "title", "status", "code"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 100, "maximum": 599},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "code": {"type": "string", "pattern": r"^[a-z0-9_]+\.[a-z0-9_.]+$"},
        "trace_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["field", "message"],
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}, "code": {"type": "string"}},
            },
        },
    },
}


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    """The response is problem+json per the envelope schema with this status and code."""
    assert response.status_code == status, getattr(response, "text", response)
    assert response.headers["content-type"].startswith(PROBLEM_MEDIA_TYPE)
    body = response.json() if callable(response.json) else response.json
    validate_problem(body)  # upstream's schema, vendored in contracts/upstream
    jsonschema.validate(body, ENVELOPE)  # and our stricter reading of it
    assert body["status"] == status
    assert body["code"] == code, body
    return body


def test_envelope_body() -> None:
    body = Problem(404, "instance.not_found", "Instance not found", "no such").body("/x", "a" * 32)
    assert body == {
        "type": "https://agentic-sandbox.aiwg.io/problems/instance-not-found",
        "title": "Instance not found",
        "status": 404,
        "code": "instance.not_found",
        "detail": "no such",
        "instance": "/x",
        "trace_id": "a" * 32,
    }
    jsonschema.validate(body, ENVELOPE)
    assert problem_type("auth.unauthorized").endswith("/auth-unauthorized")
    unauthorized = Unauthenticated("auth.unauthorized", "a valid bearer token is required")
    assert to_problem(unauthorized).headers == {"WWW-Authenticate": "Bearer"}


@pytest.mark.parametrize(
    ("body", "status", "field", "code"),
    [
        (b'{"runtime": "host"}', 422, "name", "required"),
        (b'{"name": "a", "runtime": "host"}', 422, "name", "constraint"),
        (b'{"name": "Bad_Name", "runtime": "host"}', 422, "name", "constraint"),
        (b'{"name": "ok-name", "runtime": "lxc"}', 422, "runtime", "constraint"),
        (b'{"name": "ok-name", "runtime": "host", "colour": 1}', 422, "colour", "unknown_field"),
        (b'{"name": "ok-name", "runtime": "host", "start": "yes"}', 422, "start", "type"),
        (b'{"name": "ok-name", "runtime": "host", "labels": {"a": 1}}', 422, "labels[...]", "type"),
        (b'{"name": "ok-name", "runtime": "host", "mounts": ["", 1]}', 422, "mounts[0]", "constraint"),
        (b"[]", 422, "$", "type"),
        (b"{not json", 400, "$", "json.invalid"),
        (b"", 400, "$", "json.invalid"),
    ],
)
def test_decode_json_names_the_field(body: bytes, status: int, field: str, code: str) -> None:
    with pytest.raises(ControllerError) as info:
        decode_json(body, ProvisionRequest)
    problem = to_problem(info.value)
    assert problem.status == status
    assert problem.code == "validation.failed"
    assert problem.errors is not None
    assert problem.errors[0]["field"] == field
    assert problem.errors[0]["code"] == code
    jsonschema.validate(problem.body(), ENVELOPE)


def test_decode_json_accepts_a_valid_body() -> None:
    req = decode_json(b'{"name": "agent-01", "runtime": "host", "labels": {"a": "b"}}', ProvisionRequest)
    # start: None is "the runtime's default" (host: provisioned stopped).
    assert (req.name, req.runtime, req.labels, req.start) == ("agent-01", "host", {"a": "b"}, None)


def test_a_full_limit_is_429_naming_it_with_retry_after_only_where_waiting_helps() -> None:
    sessions = Limit(name="sessions", limit=1, setting="AIWG_MAX_SESSIONS", retry_after_s=5)
    problem = to_problem(hostd_failure(HostdRemoteError("limit.reached", "full", sessions.details())))
    assert (problem.status, problem.code, problem.title) == (429, "limit.sessions", "Too many requests")
    assert problem.detail == "full (limit 1, set by AIWG_MAX_SESSIONS on hostd)"
    assert problem.headers == {"Retry-After": "5"}
    jsonschema.validate(problem.body("/x", "0" * 32), ENVELOPE)
    checkpoints = Limit(name="checkpoints", limit=256)
    problem = to_problem(hostd_failure(HostdRemoteError("limit.reached", "full", checkpoints.details())))
    assert (problem.status, problem.code, problem.detail) == (
        429,
        "limit.checkpoints",
        "full (limit 256, fixed in hostd)",
    )
    assert "Retry-After" not in problem.headers  # deleting one helps, waiting does not


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (HostdNotRunning("no socket"), 503, "internal.unavailable"),
        (HostdConnectionLost("gone"), 503, "internal.unavailable"),
        (HostdTimeout("slow"), 503, "internal.unavailable"),
        (HostdProtocolError("garbage"), 503, "internal.unavailable"),
        (HostdRemoteError("internal.error", "boom"), 503, "internal.unavailable"),
        (HostdRemoteError("limit.reached", "full"), 429, "limit.reached"),
        (HostdRemoteError("instance.not_found", "no"), 404, "instance.not_found"),
        (HostdRemoteError("instance.invalid_state", "no"), 409, "instance.invalid_state"),
        (HostdRemoteError("instance.exists", "no"), 409, "instance.already_exists"),
        (HostdRemoteError("working_dir.not_found", "no"), 422, "validation.failed"),
        (HostdRemoteError("spawn.failed", "ENOENT"), 422, "instance.spawn_failed"),
    ],
)
def test_hostd_errors_translate_once(exc: Exception, status: int, code: str) -> None:
    domain = hostd_failure(exc)  # type: ignore[arg-type]
    problem = to_problem(domain)
    assert (problem.status, problem.code) == (status, code)
    if isinstance(exc, HostdRemoteError):
        assert domain.details == {"hostd_code": exc.code}
    if status == 503:
        assert problem.headers.get("Retry-After") == "1"
        assert str(exc) in (problem.detail or "")
    # A call cut off mid-way may have taken effect; one never sent or refused did not.
    assert isinstance(domain, OutcomeUnknown) == isinstance(
        exc, HostdConnectionLost | HostdTimeout | HostdProtocolError
    )


# -- through a real app (in memory, no hostd: the link stays down) ------------------------------


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[QuartTrio]:
    env = controller_env(tmp_path, str(tmp_path / "absent.sock"), AIWG_MAX_REQUEST_BYTES="2048")
    app = create_app(load_config(env=env))

    boom = Blueprint("boom", __name__, url_prefix="/api/v2/boom")
    install_problem_handlers(boom)

    @boom.get("/crash")
    async def crash() -> None:
        raise RuntimeError("secret internals")

    app.register_blueprint(boom)
    async with app.test_app() as test_app:
        yield test_app  # type: ignore[misc]


AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


class _Resp:
    """A Quart test response with the attributes ``assert_problem`` reads."""

    def __init__(self, response: Any, data: bytes) -> None:
        self.status_code = response.status_code
        self.headers = response.headers
        self.text = data.decode()
        self.json = msgspec.json.decode(data) if data else None


async def _call(app: Any, method: str, path: str, **kwargs: Any) -> _Resp:
    client = app.test_client()
    response = await client.open(path, method=method, **kwargs)
    return _Resp(response, await response.get_data())


async def test_routing_errors_under_api_are_problems(app: Any) -> None:
    body = assert_problem(await _call(app, "GET", "/api/v2/admin/nothing-here", headers=AUTH), 404, "route.not_found")
    assert body["instance"] == "/api/v2/admin/nothing-here"
    response = await _call(app, "PATCH", "/api/v2/admin/instances", headers=AUTH)
    assert_problem(response, 405, "route.method_not_allowed")
    assert "GET" in response.headers["Allow"]


async def test_hostd_down_is_503_internal_unavailable(app: Any) -> None:
    response = await _call(app, "GET", "/api/v2/admin/instances", headers=AUTH)
    body = assert_problem(response, 503, "internal.unavailable")
    assert "hostd" in body["detail"]
    response = await _call(app, "POST", "/api/v2/admin/instances", headers=AUTH, json={"name": "x1", "runtime": "host"})
    assert_problem(response, 503, "internal.unavailable")


async def test_unexpected_errors_are_500_without_internals(app: Any, caplog: pytest.LogCaptureFixture) -> None:
    response = await _call(app, "GET", "/api/v2/boom/crash")
    body = assert_problem(response, 500, "internal.error")
    assert "secret internals" not in response.text
    assert "secret internals" in caplog.text  # logged with its traceback instead
    assert len(body["trace_id"]) == 32


async def test_body_over_the_limit_is_413(app: Any) -> None:
    big = b'{"name": "x1", "runtime": "host", "labels": {"a": "' + b"x" * 4096 + b'"}}'
    response = await _call(
        app, "POST", "/api/v2/admin/instances", headers={**AUTH, "Content-Type": "application/json"}, data=big
    )
    assert_problem(response, 413, "request.too_large")


async def test_validation_names_the_field_over_http(app: Any) -> None:
    response = await _call(app, "POST", "/api/v2/admin/instances", headers=AUTH, json={"name": "ok-name"})
    body = assert_problem(response, 422, "validation.failed")
    assert body["errors"][0]["field"] == "runtime"


async def test_traceparent_trace_id_is_kept(app: Any) -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    response = await _call(
        app, "GET", "/api/v2/admin/nothing", headers={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"}
    )
    assert response.json["trace_id"] == trace


async def test_oversized_body_does_not_wedge_a_kept_alive_connection(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    limit = controller.config.max_request_bytes

    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(limit // (1024 * 1024) + 4):
            yield b"x" * (1024 * 1024)

    for body in (b"x" * (limit + 1), chunked()):
        with trio.fail_after(15):
            response = await admin.post(
                "/api/v2/admin/loadouts", content=body, headers={"Content-Type": "application/yaml"}
            )
            assert_problem(response, 413, "request.too_large")
            # The same client again: it must not wait on a connection the server gave up on.
            assert (await admin.get("/api/v2/admin/loadouts")).status_code == 200
