"""Runtime discovery: the runtime providers hostd offers right now (``ProviderList``, never cached:
"available" must mean now). Which runtime kinds the controller itself implements is here too
(:data:`IMPLEMENTED`, what :mod:`controller.instances.service` provisions); the admin surface combines the
two into the contract's ``RuntimeProvidersResponse`` (:mod:`controller.admin.discovery`).

Errors: hostd unreachable is ``Unavailable`` from the link (503, fail closed).
"""

from __future__ import annotations

from agentic_sandbox.proto import messages as m

from ..hostlink import HostdLink
from .catalog import HOSTD_RUNTIMES

#: Admin runtime kind -> hostd runtime family.
FAMILY = {"host": "host", "docker": "container", "qemu": "vm"}
#: The runtime kinds the controller can provision (see controller.instances.service).
IMPLEMENTED = frozenset(HOSTD_RUNTIMES)


class RuntimeService:
    def __init__(self, link: HostdLink) -> None:
        self.link = link

    async def providers(self) -> list[m.ProviderInfo]:
        listing: m.ProviderListResponse = await self.link.call(m.ProviderListRequest())
        return listing.providers
