"""multi-tenant/v1 in its declared mode (upstream's v2.0 tier): tenant ids validated and echoed, not enforced.

The card declares the extension (not required: ``required`` is left out, meaning ``false``) with
the params its spec makes mandatory, ``enforcement: "declared"``. For a ``SendMessage`` or
``SendStreamingMessage`` that activates it, :func:`apply` reads ``message.metadata.tenant_id``
(absent means ``"default"``), refuses an invalid one (400 / JSON-RPC -32602, field
``metadata.tenant_id``) before anything is done, and echoes the value on the task's metadata and
on the stored message. Nothing is scoped by it: every tenant sees every task of the instance, and
no quota (429) is ever answered; the card and docs/a2a.md say so.

While the extension is active, ``runtime.host`` (runtime/v1 §8.2: omitted for multi-tenant callers
without ``fleet:read-host``) is disclosed to the admin token only, the one token here that holds
every scope (see :attr:`controller.a2a.edge.Caller.discloses_host`).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ..errors import ValidationFailed
from ..tasks.model import SendMessageRequest
from .card import MULTI_TENANT_EXTENSION

DEFAULT_TENANT = "default"
TENANT_KEY = "tenant_id"
FIELD = "metadata.tenant_id"
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def card_extension() -> dict[str, Any]:
    return {
        "uri": MULTI_TENANT_EXTENSION,
        "description": (
            "Declared, not enforced: message.metadata.tenant_id is validated and echoed on the task, but tasks "
            "are not scoped by tenant (every tenant sees every task of this instance) and no quota applies."
        ),
        # required: false, left out: the card holds no false outside the capability flags (card.py).
        "params": {
            "enforcement": "declared",
            "default_tenant": DEFAULT_TENANT,
            "quota_response": {"status": 429, "header": "Retry-After"},
        },
    }


def is_active(extensions: list[str]) -> bool:
    return any(uri.lower() == MULTI_TENANT_EXTENSION.lower() for uri in extensions)


def tenant_of(message_metadata: dict[str, Any] | None) -> str:
    if message_metadata is None or TENANT_KEY not in message_metadata:
        return DEFAULT_TENANT
    value = message_metadata[TENANT_KEY]
    if not isinstance(value, str) or _TENANT_RE.match(value) is None:
        raise ValidationFailed(
            [
                {
                    "field": FIELD,
                    "message": "must be 1-128 characters of A-Z a-z 0-9 . _ - starting with a letter or digit",
                    "code": "pattern",
                }
            ],
            details={"field": FIELD},
        )
    return value


def apply(extensions: list[str], req: SendMessageRequest) -> SendMessageRequest:
    """``req`` with the tenant echoed on the task and message metadata (unchanged if not activated)."""
    if not is_active(extensions):
        return req
    tenant = tenant_of(req.message.metadata)
    message = msgspec.structs.replace(req.message, metadata={**(req.message.metadata or {}), TENANT_KEY: tenant})
    return msgspec.structs.replace(req, message=message, metadata={**(req.metadata or {}), TENANT_KEY: tenant})
