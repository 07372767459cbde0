"""Container image catalog, read from a podman API socket through podman-py.

hostd is the only process that talks to podman (DESIGN.md §2); the controller asks for the list
with ``ImageListRequest``. podman-py speaks HTTP over the Unix socket of a ``podman system
service`` (``AIWG_PODMAN_SOCKET``, ``unix://`` only, checked by :mod:`hostd.config`), so listing
creates no process: this module is not among the fenced spawning modules.

Each :meth:`ImageCatalog.list` opens a fresh client in a worker thread, bounded by ``timeout_s``
both in requests (per socket operation) and in trio (the thread is abandoned on timeout), so a
wedged podman never holds a request and never blocks hostd's event loop. Any failure (no socket
configured, socket missing, refused, timeout, bad answer) is an answer, not an error: no images,
``degraded: true`` and the reason. The catalog is advisory.
"""

from __future__ import annotations

import builtins
import logging
import math
import os
from typing import Any

import trio

from proto import messages as m

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 3.0
MAX_REASON_CHARS = 300


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
            with trio.fail_after(self.timeout_s + 1):
                raw = await trio.to_thread.run_sync(self._list_sync, abandon_on_cancel=True)
        except trio.TooSlowError:
            return _degraded(f"podman did not answer within {self.timeout_s:g} s")
        except Exception as exc:  # any podman/requests/OS failure degrades; Cancelled is a BaseException
            log.info("podman image listing failed: %r", exc)
            return _degraded(f"podman unavailable: {_reason(exc)}")
        images: list[m.ImageInfo] = []
        for attrs in raw:
            try:
                images.append(image_from_attrs(attrs))
            except (TypeError, ValueError, AttributeError) as exc:
                log.warning("skipping malformed podman image entry: %r", exc)
        images.sort(key=lambda i: (i.name, i.reference))
        return m.ImageListResponse(images=images)

    def _list_sync(self) -> builtins.list[dict[str, Any]]:  # the method list shadows the type
        # Imported here: podman-py pulls in requests, which only this path needs.
        import podman

        path = self.socket_url.removeprefix("unix://")
        if not os.path.exists(path):
            raise FileNotFoundError(f"socket {path} does not exist")
        timeout = max(1, math.ceil(self.timeout_s))
        with podman.PodmanClient(base_url=self.socket_url, timeout=timeout) as client:
            return [dict(image.attrs) for image in client.images.list()]


def _degraded(reason: str) -> m.ImageListResponse:
    return m.ImageListResponse(images=[], degraded=True, reason=reason)


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."
