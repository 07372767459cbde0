"""Admin instance routes: list, provision, detail, decommission, lifecycle verbs, sleep and wake.

Long-running work answers 202 with an ``OperationStatus`` and ``Location`` (see
``controller.instances.service`` for what is checked before that and ``controller.auth.tokens`` for who may).
"""

from __future__ import annotations

from quart import Response, g, request

from agentic_sandbox.proto import messages as m

from ..auth.tokens import ADMIN_ONLY, OPERATE, READ, may_use_instance
from ..decoding import decode_json
from ..errors import Gone, ValidationFailed
from ..http.responses import base_url, json_response, request_body
from ..http.roles import require_role
from ..models import IdleRequest, InstanceList, InstanceView, ProvisionRequest, ReprovisionRequest, SleepRequest
from ..state import app_state
from ..store import InstanceRecord
from .blueprint import admin
from .paging import DEFAULT_PAGE_SIZE, decode_token, encode_token, narrowed_to, page_size
from .views import accepted, instance_view

TRUE = ("true", "1", "yes")
FALSE = ("false", "0", "no", "")


@admin.get("/instances")
@require_role(*READ, own_instance=True)
async def list_instances() -> Response:
    """Without ``limit`` (and ``page_token``) the whole list, as upstream answers it; with it a
    page, oldest first, and ``next_page_token`` (see :mod:`.paging`)."""
    state, args = app_state(), request.args
    wanted_state, runtime, provider = args.get("state"), args.get("runtime"), args.get("provider")
    labels = label_filter(args.getlist("label"))
    filters = {"state": wanted_state, "runtime": runtime, "provider": provider, "label": sorted(args.getlist("label"))}
    limit = page_size(args.get("limit"), default=DEFAULT_PAGE_SIZE if args.get("page_token") else None)
    host = args.get("host")
    if host is not None:
        filters["host"] = host
    base = base_url()
    if limit is None:
        records = await state.instances.list(state=wanted_state, runtime=runtime, provider=provider, labels=labels)
        visible = [
            rec
            for rec in records
            if may_use_instance(g.principal, rec.id)  # an instance token: its own
            and (host is None or rec.host_id == host)
        ]
        return json_response(InstanceList(items=[_view(rec, base) for rec in visible]))
    after = decode_token(args.get("page_token"), "instances", filters)
    records, more = await state.instances.page(
        state=wanted_state,
        runtime=runtime,
        provider=provider,
        labels=labels,
        instance_id=narrowed_to(g.principal),  # an instance token: its own
        host_id=host,
        after=after,
        limit=limit,
    )
    token = encode_token("instances", filters, (records[-1].created_at, records[-1].id)) if more else ""
    items = [_view(rec, base) for rec in records]
    return json_response(InstanceList(items=items, next_page_token=token))


def _view(rec: InstanceRecord, base: str, info: m.InstanceInfo | None = None) -> InstanceView:
    """The instance as served, its host's state beside it (this host's hostd, or another host's
    controllers: an unavailable host's instances are listed, marked so)."""
    state = app_state()
    host_state = state.hosts.state_of(rec.host_id)
    own = rec.host_id is None or rec.host_id == state.link.host_id
    available = state.link.ready if own else host_state == "available"
    return instance_view(rec, base, hostd_available=available, info=info, host_state=host_state)


def label_filter(raw: list[str]) -> list[tuple[str, str | None]]:
    """``label`` parameters, each ``key=value`` (split at the first ``=``) or a bare ``key`` (the
    instance has that label, whatever its value); an instance matches when it matches them all."""
    wanted: list[tuple[str, str | None]] = []
    for item in raw:
        key, eq, value = item.partition("=")
        if not key:
            raise ValidationFailed([{"field": "label", "message": "must be key=value or key", "code": "format"}])
        wanted.append((key, value if eq else None))
    return wanted


@admin.post("/instances")
@require_role(*ADMIN_ONLY)
async def provision_instance() -> Response:
    req = decode_json(await request_body(), ProvisionRequest)
    op, token = await app_state().instances.provision(req)
    # The instance's A2A token is shown here once (only its digest is kept).
    return accepted(op, a2a_token=token)


@admin.get("/instances/<instance_id>")
@require_role(*READ, own_instance=True)
async def get_instance(instance_id: str) -> Response:
    state = app_state()
    rec, info = await state.instances.get_detail(instance_id)
    return json_response(_view(rec, base_url(), info))


@admin.delete("/instances/<instance_id>")
@require_role(*ADMIN_ONLY)
async def decommission_instance(instance_id: str) -> Response:
    raw = request.args.get("force", "false").lower()
    if raw not in TRUE + FALSE:
        raise ValidationFailed([{"field": "force", "message": "must be true or false", "code": "type"}])
    op = await app_state().instances.decommission(instance_id, force=raw in TRUE)
    return accepted(op)


@admin.post("/instances/<instance_id>/<any(start, stop, restart):verb>")
@require_role(*OPERATE)
async def instance_lifecycle(instance_id: str, verb: str) -> Response:
    return accepted(await app_state().instances.lifecycle(instance_id, verb))


@admin.post("/instances/<instance_id>/sleep")
@require_role(*OPERATE)
async def sleep_instance(instance_id: str) -> Response:
    """Put it to sleep now (docs/sleep.md): 200 with the instance, ``409 instance.busy`` under work."""
    body = await request_body()
    req = decode_json(body, SleepRequest) if body.strip() else SleepRequest()
    state = app_state()
    rec = await state.instances.sleep(instance_id, req.how, pushing=instance_id in state.push.delivery.behind())
    return json_response(_view(rec, base_url()))


@admin.post("/instances/<instance_id>/wake")
@require_role(*OPERATE)
async def wake_instance(instance_id: str) -> Response:
    """Wake it now, whatever its idle policy says: 200 with the instance."""
    return json_response(_view(await app_state().instances.wake(instance_id), base_url()))


@admin.put("/instances/<instance_id>/idle")
@require_role(*OPERATE)
async def set_instance_idle(instance_id: str) -> Response:
    """Replace its idle policy (``{"idle": null}``: it never sleeps by itself)."""
    req = decode_json(await request_body(), IdleRequest)
    return json_response(_view(await app_state().instances.set_idle(instance_id, req.idle), base_url()))


@admin.post("/instances/<instance_id>/destroy")
@require_role(*ADMIN_ONLY)
async def destroy_instance(instance_id: str) -> Response:
    return accepted(await app_state().instances.lifecycle(instance_id, "destroy"))


@admin.post("/instances/<instance_id>/reprovision")
@require_role(*ADMIN_ONLY)
async def reprovision_instance(instance_id: str) -> Response:
    body = await request_body()
    req = decode_json(body, ReprovisionRequest) if body.strip() else ReprovisionRequest()
    return accepted(await app_state().instances.reprovision(instance_id, req.loadout))


@admin.post("/instances/<instance_id>/a2a-token")
@require_role(*ADMIN_ONLY)
async def issue_instance_token(instance_id: str) -> Response:
    token = await app_state().instances.issue_token(instance_id)
    return json_response({"instance_id": instance_id, "token": token})


@admin.post("/instances/<instance_id>/rotate-secret")
@require_role(*ADMIN_ONLY)
async def rotate_instance_secret(instance_id: str) -> Response:
    await app_state().instances.record(instance_id)  # 404 first (the catalog's word)
    raise Gone(
        "legacy_agent_secret.retired",
        "legacy agent shared-secret rotation was retired; use transport identity credentials",
    )
