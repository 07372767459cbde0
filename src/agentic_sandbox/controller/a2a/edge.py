"""What every A2A request passes before its handler: token, instance, version, extensions.

:func:`begin` is called first by every authenticated A2A handler (both bindings). In order:

1. the bearer token (:meth:`controller.auth.Authenticator.authenticate`): none or unknown → 401;
2. the instance: unknown, or not the token's own instance → 404 ``instance.not_found`` (a token of
   one instance learns nothing about another, not even that it exists);
3. ``A2A-Version`` (header, else the ``A2A-Version`` query parameter) chooses the wire version,
   per request: ``1`` or ``1.x`` is 1.0, ``0.3`` is 0.3, and a missing one means 0.3 (spec §3.6),
   on the standard paths and on the agentic-sandbox ``/v1/`` paths alike (there upstream serves
   its 0.3 shape). Anything else, or a version the binding or route does not serve (``wires``), is
   ``VERSION_NOT_SUPPORTED``. The deprecated ``/api/v1/`` surface (and a plain file download)
   keeps reading a missing version as 1.0 (``legacy_path``);
4. ``A2A-Extensions`` (and 0.3's ``X-A2A-Extensions``): the declared extensions the client asked
   for are activated (unknown ones are ignored, not echoed). runtime/v1 is required: without it →
   400 ``EXTENSION_SUPPORT_REQUIRED`` naming ``EXTENSION_REQUIRED`` and the URI, except in
   conformance mode. pty-extensions/v1 (a WebSocket extension) activated here is 400
   ``UNSUPPORTED_EXTENSION`` (its spec §5.2).

The service answers in 1.0 JSON; a binding's edge translates for a 0.3 caller
(:mod:`controller.a2a.wire03`). :func:`a2a_response` answers in the media type the client used
(:func:`response_media_type`) and echoes the activated extensions (:func:`echo_extensions`).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from quart import Response, has_request_context, request

from ..auth.tokens import ROLE_REFUSED, Principal, may_use_instance
from ..errors import (
    EXTENSION_REQUIRED,
    EXTENSION_UNSUPPORTED,
    VERSION_NOT_SUPPORTED,
    ControllerError,
    Forbidden,
    Unauthenticated,
    ValidationFailed,
)
from ..http.responses import card_base_url
from ..instances.catalog import not_found
from ..pty.frames import PTY_EXTENSIONS_URI
from ..state import app_state
from ..store import InstanceRecord
from ..tasks.prompts import HITL_EXTENSION
from .caller import WIRE_0_3, WIRE_1_0, Caller
from .card import IDEMPOTENCY_EXTENSION, MULTI_TENANT_EXTENSION, RUNTIME_EXTENSION

A2A_JSON = "application/a2a+json"
JSON = "application/json"
ACCEPTED_BODY_TYPES = (JSON, A2A_JSON)
#: Extensions this controller implements (and declares on every card).
DECLARED_EXTENSIONS = (RUNTIME_EXTENSION, IDEMPOTENCY_EXTENSION, HITL_EXTENSION, MULTI_TENANT_EXTENSION)
REQUIRED_EXTENSIONS = (RUNTIME_EXTENSION,)
#: Declared on the card but used on the PTY WebSocket only: activating them over HTTP is refused.
WEBSOCKET_EXTENSIONS = frozenset({PTY_EXTENSIONS_URI.lower()})
#: A2A 0.3's name of the ``A2A-Extensions`` header (what a2a-sdk 0.3 clients send).
LEGACY_EXTENSIONS_HEADER = "X-A2A-Extensions"
#: Both versions: what the HTTP bindings serve (the default of :func:`open_caller` is 1.0 only).
BOTH_WIRES = (WIRE_1_0, WIRE_0_3)
_VERSION_RE = re.compile(r"^(\d+)(?:\.(\d+))?$")
#: 0.3 as clients send it: ``0.3``, or with the patch number 0.3's cards carry (``0.3.0``).
_VERSION_0_3_RE = re.compile(r"^0\.3(?:\.\d+)?$")


def _version_error(message: str) -> ControllerError:
    return ValidationFailed([], message, code=VERSION_NOT_SUPPORTED)


def check_version(raw: str | None, *, legacy_path: bool, wires: tuple[str, ...] = (WIRE_1_0,)) -> str:
    """The A2A version a request speaks (:data:`WIRE_1_0` or :data:`WIRE_0_3`), from its
    ``A2A-Version`` value, if it is one of ``wires`` (module docstring)."""
    raw = (raw or "").strip()
    if not raw:
        wire = WIRE_1_0 if legacy_path else WIRE_0_3
        given = "no A2A-Version given, which means 0.3"
    elif _VERSION_0_3_RE.match(raw):
        wire, given = WIRE_0_3, "A2A-Version 0.3"
    else:
        match = _VERSION_RE.match(raw)
        if match is None or match.group(1) != "1":
            served = " and ".join(wires)
            raise _version_error(f"A2A-Version {raw[:32]!r} is not supported; this agent speaks A2A {served}")
        wire, given = WIRE_1_0, f"A2A-Version {raw[:32]}"
    if wire not in wires:
        served = " and ".join(wires)
        hint = " (send A2A-Version: 1.0)" if WIRE_1_0 in wires else ""
        raise _version_error(f"{given}; A2A {wire} is not served here (A2A {served} is){hint}")
    return wire


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
    if principal.role == ROLE_REFUSED:  # a client certificate not on the allow-list
        raise Forbidden("auth.forbidden", f"the client certificate {principal.label!r} is not allowed")
    if not may_use_instance(principal, instance_id):
        raise not_found(instance_id)
    state = app_state()
    rec = await state.a2a.instance(instance_id)
    state.activity.seen(rec.id)  # a request about it: its idle time starts over
    return rec


async def open_caller(
    *,
    authorization: str | None,
    instance_id: str,
    version: str | None,
    extensions: list[str],
    base_url: str,
    legacy_path: bool = False,
    enforce_extensions: bool = True,
    wires: tuple[str, ...] = (WIRE_1_0,),
) -> Caller:
    """Every binding's edge, given what its request carried (header or gRPC metadata values):
    the token, then the instance, then the version (one of ``wires``, the versions the binding
    serves), then the extensions (module docstring)."""
    principal = principal_of(authorization)
    rec = await instance_for(principal, instance_id)
    wire = check_version(version, legacy_path=legacy_path, wires=wires)
    activated = activate_extensions(extensions, enforce=enforce_extensions)
    return Caller(principal, rec, activated, base_url, wire=wire)


async def begin(
    instance_id: str,
    *,
    legacy_path: bool = False,
    enforce_extensions: bool = True,
    wires: tuple[str, ...] = BOTH_WIRES,
) -> Caller:
    """:func:`open_caller` for the HTTP request being served (both versions unless ``wires`` says)."""
    headers = request.headers
    requested = split_extensions(headers.getlist("A2A-Extensions") + headers.getlist(LEGACY_EXTENSIONS_HEADER))
    return await open_caller(
        authorization=headers.get("Authorization"),
        instance_id=instance_id,
        version=headers.get("A2A-Version") or request.args.get("A2A-Version"),
        extensions=list(dict.fromkeys(requested)),
        base_url=card_base_url(),
        legacy_path=legacy_path,
        enforce_extensions=enforce_extensions,
        wires=wires,
    )


def is_legacy_path() -> bool:
    """The deprecated ``/api/v1/`` surface, which reads a missing version as 1.0 (not the
    agentic-sandbox ``/agents/{id}/v1/...`` paths: there it is upstream's 0.3)."""
    return request.path.startswith("/api/v1/")


def response_media_type() -> str:
    """The media type an HTTP+JSON answer takes: the one the client's body was in, else the JSON
    one its ``Accept`` names (``application/json`` or ``application/a2a+json``), else
    ``application/a2a+json`` (spec §14.1)."""
    if not has_request_context():  # a binding that is not HTTP (gRPC) reads the body only
        return A2A_JSON
    mimetype = request.mimetype
    if mimetype in ACCEPTED_BODY_TYPES:
        return mimetype
    accept = request.headers.get("Accept", "")
    if JSON in accept and A2A_JSON not in accept:
        return JSON
    return A2A_JSON


def echo_extensions(response: Response, caller: Caller) -> Response:
    """The activated extensions in ``A2A-Extensions`` (and, for a 0.3 caller, 0.3's header too)."""
    if caller.extensions:
        value = ", ".join(caller.extensions)
        response.headers["A2A-Extensions"] = value
        if caller.wire == WIRE_0_3:
            response.headers[LEGACY_EXTENSIONS_HEADER] = value
    return response


def a2a_response(
    body: Any, caller: Caller | None = None, *, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    response = Response(msgspec.json.encode(body), status=status, content_type=response_media_type())
    if caller is not None:
        echo_extensions(response, caller)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response
