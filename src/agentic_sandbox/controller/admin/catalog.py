"""Admin catalog routes: ``GET /container-images``, ``GET|POST /loadouts``.

``/container-images`` lists what hostd's podman knows; when podman cannot be asked it answers
``{items: [], degraded: true, reason}`` (the catalog is advisory), but a hostd that cannot be asked
is 503 ``internal.unavailable`` like every hostd-backed route (see ``controller.instances.images``).
``POST /loadouts`` takes ``{name, manifest}`` as ``application/json`` or the manifest itself as
YAML (``application/x-yaml``, ``application/yaml``, ``text/yaml``, ``text/x-yaml``; the name then
comes from the manifest). 201 with the loadout (its manifest text included), 409
``loadout.already_exists`` for a taken name (built-ins included), 422 ``validation.failed`` naming
the field (``name``, ``manifest`` or ``manifest.<path>``).
"""

from __future__ import annotations

import msgspec
from quart import Response, request

from ..auth.tokens import ADMIN_ONLY, READ
from ..decoding import decode_json
from ..errors import UnsupportedMedia, ValidationFailed
from ..http.responses import request_body
from ..http.roles import require_role
from ..loadouts.service import LoadoutView
from ..state import app_state
from .blueprint import admin
from .views import image_list

JSON = "application/json"
YAML_TYPES = frozenset({"application/x-yaml", "application/yaml", "text/yaml", "text/x-yaml"})


class LoadoutCreateRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """admin-api ``LoadoutCreateRequest``."""

    name: str
    manifest: str


class LoadoutList(msgspec.Struct, kw_only=True):
    items: list[LoadoutView]


def _json(obj: msgspec.Struct, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status=status, content_type=JSON)


@admin.get("/container-images")
@require_role(*READ)
async def list_container_images() -> Response:
    return _json(image_list(await app_state().images.list_images()))


@admin.get("/loadouts")
@require_role(*READ)
async def list_loadouts() -> Response:
    return _json(LoadoutList(items=[lo.view() for lo in app_state().loadouts.list()]))


@admin.post("/loadouts")
@require_role(*ADMIN_ONLY)
async def create_loadout() -> Response:
    body = await request_body()
    name: str | None
    if request.mimetype == JSON:
        create = decode_json(body, LoadoutCreateRequest)
        name, text = create.name, create.manifest
    elif request.mimetype in YAML_TYPES:
        name = None
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ValidationFailed(
                [{"field": "manifest", "message": "the manifest is not UTF-8", "code": "encoding"}]
            ) from None
    else:
        raise UnsupportedMedia("send application/json {name, manifest} or the YAML manifest as application/x-yaml")
    loadout = await app_state().loadouts.create(text, name=name)
    return _json(loadout.view(with_manifest=True), 201)
