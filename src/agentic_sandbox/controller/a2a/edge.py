"""What every A2A request passes before its handler: token, instance, version, extensions.

:func:`begin` is called first by every authenticated A2A handler (both bindings). In order:

1. the bearer token (:meth:`controller.auth.Authenticator.authenticate`): none or unknown → 401;
2. the instance: unknown, or not the token's own instance → 404 ``instance.not_found`` (a token of
   one instance learns nothing about another, not even that it exists);
3. ``A2A-Version`` (header, else the ``A2A-Version`` query parameter): ``1`` or ``1.x`` accepted.
   Missing means 0.3 on the standard paths (spec §3.6) and is refused with
   ``VERSION_NOT_SUPPORTED`` naming 1.0; on the agentic-sandbox ``/v1/`` paths, whose published
   samples send none, missing means 1.0;
4. ``A2A-Extensions``: the declared extensions the client asked for are activated (unknown ones
   are ignored, not echoed). runtime/v1 is required: without it → 400 ``EXTENSION_SUPPORT_REQUIRED``
   naming ``EXTENSION_REQUIRED`` and the URI, except in conformance mode. pty-extensions/v1 (a
   WebSocket extension) activated here is 400 ``UNSUPPORTED_EXTENSION`` (its spec §5.2).

:func:`a2a_response` answers ``application/a2a+json`` and echoes the activated extensions.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from quart import Response, request

from ..auth.tokens import Principal, may_use_instance
from ..errors import (
    EXTENSION_REQUIRED,
    EXTENSION_UNSUPPORTED,
    VERSION_NOT_SUPPORTED,
    ControllerError,
    Unauthenticated,
    ValidationFailed,
)
from ..http.responses import base_url
from ..instances.catalog import not_found
from ..pty.frames import PTY_EXTENSIONS_URI
from ..state import app_state
from ..store import InstanceRecord
from ..tasks.prompts import HITL_EXTENSION
from .caller import WIRE_1_0, Caller
from .card import IDEMPOTENCY_EXTENSION, MULTI_TENANT_EXTENSION, RUNTIME_EXTENSION

A2A_JSON = "application/a2a+json"
ACCEPTED_BODY_TYPES = ("application/json", "application/a2a+json")
#: Extensions this controller implements (and declares on every card).
DECLARED_EXTENSIONS = (RUNTIME_EXTENSION, IDEMPOTENCY_EXTENSION, HITL_EXTENSION, MULTI_TENANT_EXTENSION)
REQUIRED_EXTENSIONS = (RUNTIME_EXTENSION,)
#: Declared on the card but used on the PTY WebSocket only: activating them over HTTP is refused.
WEBSOCKET_EXTENSIONS = frozenset({PTY_EXTENSIONS_URI.lower()})
_VERSION_RE = re.compile(r"^(\d+)(?:\.(\d+))?$")


def _version_error(message: str) -> ControllerError:
    return ValidationFailed([], message, code=VERSION_NOT_SUPPORTED)


def check_version(raw: str | None, *, legacy_path: bool) -> str:
    """The A2A version a request speaks (``"1.0"``), from its ``A2A-Version`` value."""
    raw = (raw or "").strip()
    if not raw:
        if legacy_path:
            return WIRE_1_0
        raise _version_error("no A2A-Version given, which means 0.3; this agent speaks A2A 1.0 (send A2A-Version: 1.0)")
    match = _VERSION_RE.match(raw)
    if match is None or match.group(1) != "1":
        raise _version_error(f"A2A-Version {raw[:32]!r} is not supported; this agent speaks A2A 1.0")
    return WIRE_1_0


def split_extensions(values: list[str]) -> list[str]:
    """``A2A-Extensions`` values (repeated, each comma-separated) as one list of URIs."""
    return [uri.strip() for value in values for uri in value.split(",") if uri.strip()]


def activate_extensions(requested: list[str], *, enforce: bool) -> list[str]:
    declared = {uri.lower(): uri for uri in DECLARED_EXTENSIONS}
    for uri in requested:
        if uri.lower() in WEBSOCKET_EXTENSIONS:
            raise ValidationFailed(
                [],
                f"UnsupportedExtension: {uri} is used on the PTY attach WebSocket, not on the HTTP bindings",
                code=EXTENSION_UNSUPPORTED,
                details={"extension": uri},
            )
    activated = [uri for uri in requested if uri.lower() in declared]
    if enforce and not app_state().config.conformance_mode:
        active = {uri.lower() for uri in activated}
        for uri in REQUIRED_EXTENSIONS:
            if uri.lower() not in active:
                raise ValidationFailed(
                    [],
                    f"EXTENSION_REQUIRED: the required extension {uri} was not activated (send it in A2A-Extensions)",
                    code=EXTENSION_REQUIRED,
                    details={"extension": uri, "error": "EXTENSION_REQUIRED"},
                )
    return activated


def principal_of(authorization: str | None) -> Principal:
    principal = app_state().auth.authenticate(authorization)
    if principal is None:
        raise Unauthenticated("auth.unauthorized", "a valid bearer token is required")
    return principal


def authenticate() -> Principal:
    return principal_of(request.headers.get("Authorization"))


async def instance_for(principal: Principal, instance_id: str) -> InstanceRecord:
    if not may_use_instance(principal, instance_id):
        raise not_found(instance_id)
    return await app_state().a2a.instance(instance_id)


async def open_caller(
    *,
    authorization: str | None,
    instance_id: str,
    version: str | None,
    extensions: list[str],
    base_url: str,
    legacy_path: bool = False,
    enforce_extensions: bool = True,
) -> Caller:
    """Every binding's edge, given what its request carried (header or gRPC metadata values):
    the token, then the instance, then the version, then the extensions (module docstring)."""
    principal = principal_of(authorization)
    rec = await instance_for(principal, instance_id)
    wire = check_version(version, legacy_path=legacy_path)
    activated = activate_extensions(extensions, enforce=enforce_extensions)
    return Caller(principal, rec, activated, base_url, wire=wire)


async def begin(instance_id: str, *, legacy_path: bool = False, enforce_extensions: bool = True) -> Caller:
    """:func:`open_caller` for the HTTP request being served."""
    return await open_caller(
        authorization=request.headers.get("Authorization"),
        instance_id=instance_id,
        version=request.headers.get("A2A-Version") or request.args.get("A2A-Version"),
        extensions=split_extensions(request.headers.getlist("A2A-Extensions")),
        base_url=base_url(),
        legacy_path=legacy_path,
        enforce_extensions=enforce_extensions,
    )


def is_legacy_path() -> bool:
    """The agentic-sandbox ``/agents/{id}/v1/...`` paths (see :func:`check_version`)."""
    rule = request.url_rule.rule if request.url_rule is not None else request.path
    return "/v1/" in rule


def a2a_response(
    body: Any, caller: Caller | None = None, *, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    response = Response(msgspec.json.encode(body), status=status, content_type=A2A_JSON)
    if caller is not None and caller.extensions:
        response.headers["A2A-Extensions"] = ", ".join(caller.extensions)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response
