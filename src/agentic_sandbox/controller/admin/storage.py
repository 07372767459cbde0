"""Admin storage routes: ``GET|PUT|DELETE /api/v2/admin/storage/{scope}/{path}``.

The path rule (and why symlinks are never followed) is in ``controller.storage``. In short:
``global`` is read-only here (PUT/DELETE → 403 ``storage.scope_disabled``); ``inbox`` and
``outbox`` paths are ``<instance_id>/<name...>`` and a write needs that instance in the catalog
(404 ``instance.not_found`` otherwise); a path that tries to leave its scope is a 422
``validation.failed`` naming ``path``.

The rule takes ``{path}`` with a converter that matches anything (a leading ``/`` included) and
does not merge slashes, so ``inbox//etc/passwd`` reaches the validator and is refused as absolute
rather than being silently rewritten by the router. hypercorn percent-decodes the path before
routing, so ``%2e%2e`` and ``%2F`` arrive as ``..`` and ``/`` and meet the same checks; escapes
that are not UTF-8 (``%ff``) are refused from the raw path, before hypercorn's replacement
character could make two names one.

GET answers the JSON ``StorageObject`` unless ``Accept`` prefers the object's own media type or
``application/octet-stream``, in which case the raw bytes are sent (streamed for objects above the
size limit, whose JSON form carries metadata only). PUT takes ``application/json`` as a
``StorageObjectWrite`` (``{media_type?, content | content_base64}``); any other ``Content-Type`` is
stored raw with that media type. To store a raw JSON document, wrap it in ``content``.

The view functions are plain coroutines so the v1 compatibility routes can call them as they are.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import AsyncIterator, Iterator
from urllib.parse import unquote_to_bytes

import msgspec
import trio
from quart import Response, request
from werkzeug.routing import BaseConverter

from ..auth.tokens import OPERATE, READ
from ..decoding import decode_json
from ..errors import ValidationFailed
from ..http.responses import request_body
from ..http.roles import require_role
from ..state import app_state
from ..storage import (
    SCOPES,
    WRITABLE_SCOPES,
    InvalidPath,
    ScopeReadOnly,
    guess_media_type,
    is_textual,
    validate_media_type,
    validate_path,
)
from .blueprint import admin

JSON = "application/json"
OCTET = "application/octet-stream"


class StorageObjectWrite(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """admin-api ``StorageObjectWrite``: exactly one of ``content`` / ``content_base64``."""

    media_type: str | None = None
    content: str | None = None
    content_base64: str | None = None


class _AnyPathConverter(BaseConverter):
    """Matches any non-empty rest of the URL, leading or doubled slashes and newlines included."""

    regex = r"[\s\S]+"  # not ".+": a decoded %0A must reach the validator (422), not miss the route
    part_isolating = False
    weight = 200


@admin.record_once
def _register_converter(state: object) -> None:
    # Runs before the rules below are added (deferred functions run in recording order).
    state.app.url_map.converters.setdefault("storagepath", _AnyPathConverter)  # type: ignore[attr-defined]


def _check_scope(scope: str) -> None:
    if scope not in SCOPES:
        raise ValidationFailed(
            [{"field": "scope", "message": f"must be one of {', '.join(SCOPES)}", "code": "enum.invalid"}]
        )


def _check_utf8() -> None:
    """Refuse a request path whose percent-escapes are not UTF-8 (InvalidPath).

    hypercorn decodes the ASGI ``path`` with ``errors="replace"``, so ``%ff.txt`` reaches the
    route as ``\ufffd.txt`` and would name the same object as ``%fe.txt`` or a real U+FFFD. The
    undecoded ``raw_path`` still holds the bytes. Call it after ``_check_scope``: with the scope
    known, any byte that is not UTF-8 lies in ``{path}``.
    """
    raw = request.scope.get("raw_path")
    if raw is None:
        return
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidPath("path is not valid UTF-8") from None


def _json(obj: msgspec.Struct, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status=status, content_type=JSON)


def _raw_type(media_type: str) -> str | None:
    """The media type to answer raw bytes with, or None for the JSON form (see module docstring)."""
    accept = request.accept_mimetypes
    if not accept:
        return None
    base = media_type.split(";", 1)[0].strip().lower()
    best = accept.best_match([JSON, base, OCTET])
    if best is None or best == JSON:
        return None
    return media_type if best == base else OCTET


async def _stream(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    try:
        while (chunk := await trio.to_thread.run_sync(next, chunks, None)) is not None:
            yield chunk
    finally:
        chunks.close()  # type: ignore[attr-defined]  # a generator: closes its fd


@admin.get("/storage/<scope>/<storagepath:path>", merge_slashes=False)
@require_role(*READ)
async def get_storage_object(scope: str, path: str) -> Response:
    _check_scope(scope)
    service = app_state().storage
    _check_utf8()
    obj = await service.read(scope, path)
    raw_type = _raw_type(obj.meta.media_type)
    if raw_type is not None:
        if obj.data is not None:
            return Response(obj.data, content_type=raw_type)
        meta, chunks = await service.stream(scope, path)
        response = Response(_stream(chunks), content_type=raw_type)
        response.headers["Content-Length"] = str(meta.size_bytes)
        return response
    meta = obj.meta
    if obj.data is not None:
        text = None
        if is_textual(meta.media_type):
            with contextlib.suppress(UnicodeDecodeError):
                text = obj.data.decode("utf-8")
        if text is not None:
            meta = msgspec.structs.replace(meta, content=text)
        else:
            meta = msgspec.structs.replace(meta, content_base64=base64.b64encode(obj.data).decode("ascii"))
    return _json(meta)


def _media_type_or_422(media_type: str) -> str:
    try:
        return validate_media_type(media_type)
    except ValueError as exc:
        raise ValidationFailed([{"field": "media_type", "message": str(exc), "code": "media_type.invalid"}]) from None


async def _decode_write(path: str) -> tuple[bytes, str]:
    body = await request_body()
    if request.mimetype != JSON:
        return body, _media_type_or_422(request.headers.get("Content-Type") or OCTET)
    write = decode_json(body, StorageObjectWrite)
    if (write.content is None) == (write.content_base64 is None):
        raise ValidationFailed(
            [{"field": "content", "message": "give exactly one of content or content_base64", "code": "oneof"}]
        )
    if write.content is not None:
        data = write.content.encode("utf-8", "surrogatepass")
        default = guess_media_type(path.rsplit("/", 1)[-1])
        default = default if is_textual(default) else "text/plain; charset=utf-8"
    else:
        try:
            data = base64.b64decode(write.content_base64 or "", validate=True)
        except (binascii.Error, ValueError):
            raise ValidationFailed(
                [{"field": "content_base64", "message": "not valid base64", "code": "base64.invalid"}]
            ) from None
        default = OCTET
    return data, _media_type_or_422(write.media_type or default)


@admin.put("/storage/<scope>/<storagepath:path>", merge_slashes=False)
@require_role(*OPERATE)
async def put_storage_object(scope: str, path: str) -> Response:
    _check_scope(scope)
    state = app_state()
    if scope not in WRITABLE_SCOPES:
        raise ScopeReadOnly(scope)  # before reading the body: the answer cannot change
    _check_utf8()
    target = validate_path(scope, path)
    await state.instances.storage_owner(target.parts[0])
    data, media_type = await _decode_write(path)
    meta, created = await state.storage.write(scope, path, data, media_type)
    return _json(meta, 201 if created else 200)


@admin.delete("/storage/<scope>/<storagepath:path>", merge_slashes=False)
@require_role(*OPERATE)
async def delete_storage_object(scope: str, path: str) -> Response:
    _check_scope(scope)
    _check_utf8()
    await app_state().storage.delete(scope, path)
    return Response(b"", status=204)
