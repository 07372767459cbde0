"""Admin catalog routes: ``GET /container-images``, ``GET|POST /loadouts``.

``/container-images`` never fails because podman is away: it answers ``{items: [], degraded:
true, reason}`` (see ``controller.images``). ``POST /loadouts`` takes ``{name, manifest}`` as
``application/json`` or the manifest itself as YAML (``application/x-yaml``, ``application/yaml``,
``text/yaml``, ``text/x-yaml``; the name then comes from the manifest). 201 with the loadout (its
manifest text included), 409 ``loadout.already_exists`` for a taken name (built-ins included), 422
``validation.failed`` naming the field (``name``, ``manifest`` or ``manifest.<path>``).
"""

from __future__ import annotations

import msgspec
from quart import Response, current_app, request

from ..auth import ADMIN_ONLY, READ, require_role
from ..images import ImageService
from ..loadouts import LoadoutExists, LoadoutInvalid, LoadoutService, LoadoutView
from ..problems import Problem, conflict, decode_json, validation_failed
from . import admin

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
    images: ImageService = current_app.extensions["images"]
    return _json(await images.list_images())


@admin.get("/loadouts")
@require_role(*READ)
async def list_loadouts() -> Response:
    loadouts: LoadoutService = current_app.extensions["loadouts"]
    return _json(LoadoutList(items=[lo.view() for lo in loadouts.list()]))


@admin.post("/loadouts")
@require_role(*ADMIN_ONLY)
async def create_loadout() -> Response:
    loadouts: LoadoutService = current_app.extensions["loadouts"]
    body = await request.get_data(cache=False, as_text=False)
    name: str | None
    if request.mimetype == JSON:
        create = decode_json(body, LoadoutCreateRequest)
        name, text = create.name, create.manifest
    elif request.mimetype in YAML_TYPES:
        name = None
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise validation_failed(
                [{"field": "manifest", "message": "the manifest is not UTF-8", "code": "encoding"}]
            ) from None
    else:
        raise Problem(
            415,
            "validation.failed",
            "Unsupported media type",
            "send application/json {name, manifest} or the YAML manifest as application/x-yaml",
        )
    try:
        loadout = await loadouts.create(text, name=name)
    except LoadoutInvalid as exc:
        raise validation_failed([{"field": exc.field, "message": exc.message, "code": "manifest.invalid"}]) from None
    except LoadoutExists as exc:
        raise conflict("loadout.already_exists", str(exc)) from None
    return _json(loadout.view(with_manifest=True), 201)
