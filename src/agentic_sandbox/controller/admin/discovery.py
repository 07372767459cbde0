"""Admin discovery: ``GET /runtime/providers``, ``GET /bootstrap/readiness``, ``GET /mcp/discovery``.

``/runtime/providers`` is hostd's provider list right now (503 when hostd cannot be asked) in the
contract's ``RuntimeProvidersResponse``. The admin API names runtime kinds ``host``, ``docker``
and ``qemu``; hostd names the families ``host``, ``container`` and ``vm``. A kind is available only
when the controller provisions it (``controller.runtimes.IMPLEMENTED``) and hostd offers an
available provider of its family, so ``docker`` and ``qemu`` say ``runtime.not_implemented`` until
their providers land, whatever hostd offers. Unknown values are kept: every provider hostd lists
is reported with its own family, name and capabilities, known or not; a family outside the three
has no admin runtime kind and no isolation tier we could state, so it is listed among the
providers only. ``default_vm_provider`` (required by the contract) is hostd's default ``vm``
provider, else ``libvirt``, the one this executor is built around (listed only once hostd offers it).

``/bootstrap/readiness`` and ``/mcp/discovery`` say what this deployment has, in the contract's
shapes: no gRPC mTLS bootstrap (agents run under hostd and are reached over its Unix socket) and no
MCP adapter (``POST /mcp`` is not served), so both are ``status: disabled`` with the reason; never
a document that claims more. They are constant, so they are built once.
"""

from __future__ import annotations

import platform
from typing import Any

import msgspec
from quart import Response

from agentic_sandbox.proto import messages as m

from ..auth.tokens import READ
from ..http.responses import json_response
from ..http.roles import require_role
from ..instances.runtimes import FAMILY, IMPLEMENTED
from ..state import app_state
from .blueprint import admin

#: What each admin runtime kind isolates (the contract's ``isolation_tier``).
ISOLATION = {"host": "full-host-access", "docker": "shared-kernel", "qemu": "hardware-virtualized"}
#: The VM provider this executor is built around (reported while hostd offers none).
DESIGNED_VM_PROVIDER = "libvirt"


class RuntimeKind(msgspec.Struct, kw_only=True, omit_defaults=True):
    """admin-api ``RuntimeKindDescriptor``."""

    id: str
    available: bool
    isolation_tier: str
    architecture: str
    capabilities: list[str]
    unavailable_code: str | None = None
    unavailable_reason: str | None = None


class ProviderDescriptor(msgspec.Struct, kw_only=True, omit_defaults=True):
    """admin-api ``RuntimeProviderDescriptor``."""

    id: str
    runtime: str
    available: bool
    is_default: bool
    capabilities: list[str]
    unavailable_code: str | None = None
    unavailable_reason: str | None = None


class RuntimeProviders(msgspec.Struct, kw_only=True):
    """admin-api ``RuntimeProvidersResponse``."""

    default_vm_provider: str
    providers: list[ProviderDescriptor]
    runtimes: list[RuntimeKind]


def _unique(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


def describe(providers: list[m.ProviderInfo], *, architecture: str) -> RuntimeProviders:
    """The discovery document for hostd's provider list (see the module docstring)."""
    out = [
        ProviderDescriptor(
            id=p.provider,
            runtime=p.runtime,
            available=p.available,
            is_default=p.default,
            capabilities=_unique(p.capabilities),
            unavailable_code=None if p.available else "provider.unavailable",
            unavailable_reason=None if p.available else (p.reason or "hostd reports it unavailable"),
        )
        for p in providers
    ]
    kinds = []
    for kind, family in FAMILY.items():
        members = [p for p in providers if p.runtime == family]
        code = reason = None
        if kind not in IMPLEMENTED:
            code, reason = "runtime.not_implemented", f"the controller does not provision {kind} instances yet"
        elif not members:
            code, reason = "provider.absent", f"hostd offers no {family} provider"
        elif not any(p.available for p in members):
            code = "provider.unavailable"
            reason = "; ".join(f"{p.provider}: {p.reason or 'unavailable'}" for p in members)
        kinds.append(
            RuntimeKind(
                id=kind,
                available=code is None,
                isolation_tier=ISOLATION[kind],
                architecture=architecture,
                capabilities=_unique([c for p in members for c in p.capabilities]),
                unavailable_code=code,
                unavailable_reason=reason,
            )
        )
    vm_default = next((p.provider for p in providers if p.runtime == "vm" and p.default), None)
    return RuntimeProviders(default_vm_provider=vm_default or DESIGNED_VM_PROVIDER, providers=out, runtimes=kinds)


@admin.get("/runtime/providers")
@require_role(*READ)
async def list_runtime_providers() -> Response:
    providers = await app_state().runtimes.providers()
    return json_response(describe(providers, architecture=platform.machine() or "unknown"))


# -- bootstrap readiness and MCP discovery: what this deployment does not have ------------------

ENROLLMENT_ENDPOINT = "/api/v1/bootstrap-enrollment/consume"

BOOTSTRAP_READINESS: dict[str, Any] = {
    "status": "disabled",
    # Not in upstream's schema (which allows extra members): the stable reason, as MCP has one.
    "reason_code": "bootstrap.not_supported",
    "ca_provider": {
        "configured": False,
        "status": "disabled",
        "backend": None,
        "trust_domain": None,
        "root_key_store": None,
        "trust_bundle": {"present": False, "freshness": "unknown", "revision": None, "expires_at_unix_ms": None},
        "reason": "this executor has no gRPC CA backend: agents run under hostd and are reached over its Unix socket",
    },
    "bootstrap": {
        "token_store_configured": False,
        "status": "disabled",
        "enrollment_endpoint": ENROLLMENT_ENDPOINT,
        "auth": "one_time_bootstrap_token_bound_to_spiffe_id",
        "token_counts": None,
        "origin_posture": {
            "path": ENROLLMENT_ENDPOINT,
            "tls_required_by_contract": True,
            "listener_state": "not_reported",
            "reason": "this executor serves no bootstrap enrollment endpoint",
        },
        "reason": "mTLS bootstrap enrollment is not part of this executor",
    },
    "error_taxonomy": [],
    "notes": [f"{ENROLLMENT_ENDPOINT} is not served by this executor"],
}

MCP_DISCOVERY: dict[str, Any] = {
    "enabled": False,
    "status": "disabled",
    "reason_code": "mcp.adapter_absent",
    "endpoint": {
        "path": "/mcp",
        "methods": ["POST"],
        "transport": "streamable-http",
        "stateless": True,
        "get_behavior": "405_method_not_allowed",
        "mcp_session_id": False,
    },
    "protocol": {"latest": "", "supported": []},
    "auth": {
        "scheme": "bearer",
        "required": True,
        "principal_config": "mcp-principals.toml",
        "principals": [],
        "scopes": [],
    },
    "capabilities": {},
    "tools": [],
    "resources": [],
    "resource_templates": [],
    "errors": [],
    "notes": ["this executor has no MCP management adapter: POST /mcp is not served and no protocol version is"],
}

_BOOTSTRAP_BODY = msgspec.json.encode(BOOTSTRAP_READINESS)
_MCP_BODY = msgspec.json.encode(MCP_DISCOVERY)


@admin.get("/bootstrap/readiness")
@require_role(*READ)
async def bootstrap_readiness() -> Response:
    return Response(_BOOTSTRAP_BODY, content_type="application/json")


@admin.get("/mcp/discovery")
@require_role(*READ)
async def mcp_discovery() -> Response:
    return Response(_MCP_BODY, content_type="application/json")
