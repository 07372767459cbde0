"""Container image catalog, read from a podman API socket through podman-py.

hostd is the only process that talks to podman (DESIGN.md §2); the controller asks for the list
with ``ImageListRequest``. podman-py speaks HTTP over the Unix socket of a ``podman system
service`` (``AIWG_PODMAN_SOCKET``, ``unix://`` only, checked by :mod:`hostd.config`), so listing
creates no process: this module is not among the fenced spawning modules.

Each :meth:`ImageCatalog.list` opens a fresh client in a worker thread
(:func:`.connection.call`), bounded by ``timeout_s`` both in requests (per socket operation)
and in trio (the thread is abandoned on timeout), so a wedged podman never holds a request and
never blocks hostd's event loop. Any failure (no socket configured, socket missing, refused,
timeout, bad answer) is an answer, not an error: no images,
``degraded: true`` and the reason. The catalog is advisory.
"""

from __future__ import annotations

import logging
from typing import Any

from agentic_sandbox.proto import messages as m

from . import connection

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 3.0


def image_from_attrs(attrs: dict[str, Any]) -> m.ImageInfo:
    """Map one libpod ``/images/json`` entry onto :class:`proto.messages.ImageInfo`."""
    image_id = str(attrs.get("Id") or "")
    tags = [t for t in attrs.get("RepoTags") or [] if t and t != "<none>:<none>"]
    reference = tags[0] if tags else image_id
    repo = reference.rsplit(":", 1)[0] if tags and ":" in reference.rsplit("/", 1)[-1] else reference
    name = repo.rsplit("/", 1)[-1] if tags else image_id[:12]
    digest = attrs.get("Digest") or (f"sha256:{image_id}" if image_id and ":" not in image_id else image_id) or None
    size = attrs.get("Size")
    labels = attrs.get("Labels") or {}
    return m.ImageInfo(
        name=name or reference,
        reference=reference,
        digest=str(digest) if digest else None,
        size_bytes=int(size) if isinstance(size, int | float) and size >= 0 else None,
        labels={str(k): str(v) for k, v in labels.items()},
    )


class ImageCatalog:
    """Lists images from the podman API socket at ``socket_url`` ("" = none configured)."""

    def __init__(self, socket_url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.socket_url = socket_url
        self.timeout_s = timeout_s

    async def list(self) -> m.ImageListResponse:
        if not self.socket_url:
            return _degraded("no podman socket configured")
        try:
            raw = await connection.call(self.socket_url, _list_sync, timeout_s=self.timeout_s)
        except connection.PodmanUnreachable as exc:
            return _degraded(str(exc))
        except Exception as exc:  # any podman/requests/OS failure degrades; Cancelled is a BaseException
            log.info("podman image listing failed: %r", exc)
            return _degraded(f"podman unavailable: {connection.reason(exc)}")
        images: list[m.ImageInfo] = []
        for attrs in raw:
            try:
                images.append(image_from_attrs(attrs))
            except (TypeError, ValueError, AttributeError) as exc:
                log.warning("skipping malformed podman image entry: %r", exc)
        images.sort(key=lambda i: (i.name, i.reference))
        return m.ImageListResponse(images=images)


def _list_sync(client: Any) -> list[dict[str, Any]]:
    return [dict(image.attrs) for image in client.images.list()]


def _degraded(reason: str) -> m.ImageListResponse:
    return m.ImageListResponse(images=[], degraded=True, reason=reason)
