"""Who an A2A request comes from, as the A2A service sees it: the principal, its instance, the
extensions it activated and the origin it reached us at. Made by the HTTP edge
(:func:`agentic_sandbox.controller.a2a.edge.begin`); read by the service layer, which knows no HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..auth.tokens import ROLE_ADMIN, Principal
from ..store import InstanceRecord
from ..tasks.prompts import activated
from .card import MULTI_TENANT_EXTENSION

WIRE_1_0 = "1.0"
WIRE_0_3 = "0.3"


@dataclass
class Caller:
    principal: Principal
    instance: InstanceRecord
    #: Activated extension URIs, in the client's spelling (echoed back as sent).
    extensions: list[str] = field(default_factory=list)
    #: The origin the caller reached us at (what a card it is handed names).
    base_url: str = ""
    #: The A2A version the request speaks on the wire (:data:`WIRE_1_0` or :data:`WIRE_0_3`): the
    #: service answers in 1.0 and the binding's edge translates a 0.3 answer.
    wire: str = "1.0"

    @property
    def discloses_host(self) -> bool:
        """``runtime.host`` policy: operator tokens see the host name, instance tokens do not.

        With multi-tenant/v1 active only the admin token does (runtime/v1 §8.2: multi-tenant
        callers see it only with ``fleet:read-host``, a scope only the admin token holds here).
        """
        if any(uri.lower() == MULTI_TENANT_EXTENSION.lower() for uri in self.extensions):
            return self.principal.role == ROLE_ADMIN
        return self.principal.instance_id is None

    @property
    def sees_prompts(self) -> bool:
        """hitl-prompt/v1 is active: prompt envelopes are shown, and prompts may be answered."""
        return activated(self.extensions)
