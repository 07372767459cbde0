"""Admin Cloud Hypervisor routes: upstream's ``/cloud-hypervisor/...`` verbs, answered honestly.

This executor has no Cloud Hypervisor provider (its VMs are libvirt's, runtime ``qemu``), so every
one of upstream's five routes answers 501 ``provider.unavailable`` naming the provider, after the
usual authentication (admin role, as for every verb that would create or hand out a VM). The
request body is not read: nothing would act on it. Documented in ``controller/openapi.yaml``.
"""

from __future__ import annotations

from quart import Response

from ..auth.tokens import ADMIN_ONLY
from ..errors import Unimplemented
from ..http.roles import require_role
from .blueprint import admin

UNAVAILABLE = (
    "the cloud-hypervisor provider is not available on this host: this executor offers no Cloud Hypervisor "
    "integration (VMs run through libvirt, runtime qemu); GET /api/v2/admin/runtime/providers lists what is"
)


def _unavailable() -> Unimplemented:
    return Unimplemented("provider.unavailable", UNAVAILABLE, details={"provider": "cloud-hypervisor"})


@admin.post("/cloud-hypervisor/snapshots")
@admin.post("/cloud-hypervisor/warm-pools")
@require_role(*ADMIN_ONLY)
async def cloud_hypervisor_collection() -> Response:
    raise _unavailable()


@admin.post("/cloud-hypervisor/snapshots/<snapshot_id>/<any(restore, fork):verb>")
@require_role(*ADMIN_ONLY)
async def cloud_hypervisor_snapshot(snapshot_id: str, verb: str) -> Response:
    raise _unavailable()


@admin.post("/cloud-hypervisor/warm-pools/<pool>/handoff")
@require_role(*ADMIN_ONLY)
async def cloud_hypervisor_handoff(pool: str) -> Response:
    raise _unavailable()
