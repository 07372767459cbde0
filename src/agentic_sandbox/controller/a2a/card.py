"""The per-instance AgentCard (A2A v1.0) and its signature.

:func:`build_card` composes the card from the catalog record and the loadout: v1.0 fields only,
``supportedInterfaces`` for the bindings this controller serves (the instance's base URL, no
trailing slash), the bearer security scheme of the instance token, and the runtime/v1 extension
with its params. :func:`sign_card` signs it per DESIGN §5: JCS (RFC 8785) of the card without
``signatures``, a detached JWS with the protected header ``{"alg": "EdDSA", "kid", "typ": "JOSE",
"jku"}`` (Ed25519), stored as ``signatures[{protected, signature}]``; with one more signature for
each other form a verifier canonicalizes the card to (the card served carries 0.3's fields too:
``card03``).

A card is signed only if it holds no empty string, list or object and no ``false`` outside the
optional capability flags (:func:`check_signable`): verifiers disagree on whether such values are
part of the signed form (a2a-sdk drops them, the spec keeps them), so we never emit them and every
verifier reads the same bytes.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..auth.credentials import b64url
from ..errors import InternalError
from ..instances.catalog import HOSTD_RUNTIMES
from ..store import InstanceRecord

RUNTIME_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/runtime/v1"
IDEMPOTENCY_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1"
MULTI_TENANT_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/multi-tenant/v1"
PROTOCOL_VERSION = "1.0"
CARD_VERSION = "0.1.0"
#: Bindings served at the instance's base URL, in the order clients should prefer them.
BINDINGS = ("JSONRPC", "HTTP+JSON")
#: The loadout an instance provisioned without one runs its tasks with.
DEFAULT_LOADOUT = "shell"
#: Optional capability flags of the v1.0 model: the only places a ``false`` may stand.
OPTIONAL_FLAGS = frozenset({"streaming", "pushNotifications", "extendedAgentCard"})
HOST_ACCESS = (
    "This instance runs on the host runtime: its tasks run directly on the host machine with full host "
    "access (no container or VM boundary)."
)


def instance_url(base_url: str, instance_id: str) -> str:
    return f"{base_url.rstrip('/')}/agents/{instance_id}"


def grpc_interface(base_url: str, port: int, instance_id: str) -> dict[str, Any]:
    """The GRPC interface: ``host:port`` as a gRPC client dials it (the host the caller reached us
    at, the gRPC port) and the instance as its ``tenant``: one gRPC service serves every instance,
    and a2a-sdk's client puts the interface's tenant in each request (controller.a2a.grpcbinding)."""
    host = urlsplit(base_url).hostname or "localhost"
    host = f"[{host}]" if ":" in host else host
    return {
        "url": f"{host}:{port}",
        "protocolBinding": "GRPC",
        "protocolVersion": PROTOCOL_VERSION,
        "tenant": instance_id,
    }


#: runtime/v1's forms (``params.schema.json``): a value in no form is left out, never bent into one.
CAPABILITY_FORM = re.compile(r"^[a-z0-9][a-z0-9._:-]{0,127}$")
MAX_CAPABILITIES = 128
IMAGE_REF_FORMS = {
    "vm": re.compile(r"^qcow2://.+@sha256:[0-9a-f]{64}(\?.*)?$"),
    "container": re.compile(r"^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+(@sha256:[0-9a-f]{64}|:[A-Za-z0-9._-]+)$"),
}
MAX_IMAGE_REF = 1024


def runtime_params(rec: InstanceRecord) -> dict[str, Any]:
    """runtime/v1 params (``params.schema.json``) from the catalog row, whose provider facts are
    hostd's (folded in at every reconcile): the kind and provider, the provider's capabilities of
    this instance, and ``image_ref`` as resolved where it has runtime/v1's form for the kind (a
    container's ``registry/name@sha256:...``, a VM's ``qcow2://...@sha256:...``). A host instance
    has no image; neither has a direct-boot VM (kernel and initramfs, which no runtime/v1 form names).
    """
    kind = HOSTD_RUNTIMES[rec.runtime][0] if rec.runtime in HOSTD_RUNTIMES else rec.runtime
    params: dict[str, Any] = {
        # runtime/v1 names the broad kind (vm, container, host), not the admin contract's qemu/docker.
        "runtime": kind,
        "loadout": rec.loadout or DEFAULT_LOADOUT,
        "instance_id": rec.id,
    }
    if rec.provider:
        params["provider"] = rec.provider
    elif rec.runtime == "host":
        params["provider"] = "hostd"
    capabilities = [c for c in dict.fromkeys(rec.capabilities) if CAPABILITY_FORM.match(c)][:MAX_CAPABILITIES]
    if capabilities:
        params["capabilities"] = capabilities
    form = IMAGE_REF_FORMS.get(kind)
    if form is not None and rec.image_ref and len(rec.image_ref) <= MAX_IMAGE_REF and form.match(rec.image_ref):
        params["image_ref"] = rec.image_ref
    return params


def build_card(
    rec: InstanceRecord, base_url: str, *, loadout_description: str | None, streaming: bool, bindings: tuple[str, ...]
) -> dict[str, Any]:
    url = instance_url(base_url, rec.id)
    loadout = rec.loadout or DEFAULT_LOADOUT
    description = f"agentic-sandbox {rec.runtime} instance {rec.name!r}; tasks run the {loadout!r} loadout."
    if rec.runtime == "host":
        description = f"{description} {HOST_ACCESS}"
    skill_description = loadout_description or f"Runs each task with the {loadout} loadout's agent command."
    if rec.runtime == "host":
        skill_description = f"{skill_description} Full host access."
    return {
        "name": rec.name,
        "description": description,
        "version": CARD_VERSION,
        "provider": {"organization": "agentic-sandbox executor", "url": base_url.rstrip("/")},
        "supportedInterfaces": [
            {"url": url, "protocolBinding": binding, "protocolVersion": PROTOCOL_VERSION} for binding in bindings
        ],
        "capabilities": {
            "streaming": streaming,
            "pushNotifications": True,
            "extendedAgentCard": True,
            "extensions": [
                {
                    "uri": RUNTIME_EXTENSION,
                    "description": "Names the runtime backing this instance; activate it with A2A-Extensions.",
                    "required": True,
                    "params": runtime_params(rec),
                }
            ],
        },
        "securitySchemes": {
            "bearer": {
                "httpAuthSecurityScheme": {
                    "scheme": "Bearer",
                    "description": "The instance's own bearer token (issued at provisioning) or an operator token.",
                }
            }
        },
        "securityRequirements": [{"schemes": {"bearer": {"list": ["a2a"]}}}],
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [
            {
                "id": loadout,
                "name": f"{loadout} agent",
                "description": skill_description,
                "tags": [rec.runtime, loadout],
            }
        ],
    }


def check_signable(value: Any, path: str = "$") -> None:
    """Refuse (as our bug) a card holding values verifiers would canonicalize differently."""
    if isinstance(value, dict):
        if not value:
            raise InternalError("internal.error", f"the AgentCard holds an empty object at {path}")
        for key, item in value.items():
            if item is False and key not in OPTIONAL_FLAGS:
                raise InternalError("internal.error", f"the AgentCard holds false at {path}.{key}")
            check_signable(item, f"{path}.{key}")
    elif isinstance(value, list):
        if not value:
            raise InternalError("internal.error", f"the AgentCard holds an empty list at {path}")
        for index, item in enumerate(value):
            check_signable(item, f"{path}[{index}]")
    elif value == "" or value is None:
        raise InternalError("internal.error", f"the AgentCard holds an empty value at {path}")


def canonical_payload(card: dict[str, Any]) -> bytes:
    unsigned = {key: value for key, value in card.items() if key != "signatures"}
    payload: bytes = rfc8785.dumps(unsigned)
    return payload


def sign_card(
    card: dict[str, Any], key: Ed25519PrivateKey, *, kid: str, jku: str, also: tuple[bytes, ...] = ()
) -> dict[str, Any]:
    """``card`` with ``signatures``: one over its own canonical form, and one more over each other
    payload in ``also`` (the forms other verifiers canonicalize the card to, see ``card03``)."""
    check_signable(card)
    header = {"alg": "EdDSA", "kid": kid, "typ": "JOSE", "jku": jku}
    protected = b64url(json.dumps(header, separators=(",", ":"), sort_keys=True).encode())
    signatures = []
    for payload in dict.fromkeys((canonical_payload(card), *also)):
        signature = b64url(key.sign(f"{protected}.{b64url(payload)}".encode()))
        signatures.append({"protected": protected, "signature": signature})
    return {**card, "signatures": signatures}
