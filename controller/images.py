"""Container image catalog, read from a podman API socket through podman-py.

The controller never runs ``podman`` (its audit hook forbids process creation): podman-py speaks
HTTP over the Unix socket of a ``podman system service``. Only ``unix://`` sockets are accepted,
because podman-py's ``ssh://`` transport would spawn an ssh client.

Each ``list_images`` call opens a fresh client in a worker thread, bounded by ``timeout_s`` both
in requests (per socket operation) and in trio (the thread is abandoned on timeout, so a wedged
podman never holds a request). Any failure (no socket configured, socket missing, refused,
timeout, bad answer) gives an empty list with ``degraded: true`` and the reason: the catalog is
advisory, so it degrades instead of failing the request.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import msgspec
import trio

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 3.0


class ContainerImage(msgspec.Struct, kw_only=True, omit_defaults=True):
    """admin-api ``ContainerImage``."""

    name: str
    reference: str
    digest: str | None = None
    size_bytes: int | None = None
    labels: dict[str, str] = {}


class ImageList(msgspec.Struct, kw_only=True, omit_defaults=True):
    items: list[ContainerImage]
    degraded: bool = False
    reason: str | None = None


def socket_url(socket: str) -> str:
    """``/run/podman.sock`` or ``unix:///run/podman.sock`` → ``unix:///run/podman.sock``."""
    if socket.startswith("unix://"):
        socket = socket.removeprefix("unix://")
    elif "://" in socket:
        raise ValueError(f"only unix:// podman sockets are supported, got {socket!r}")
    if not socket.startswith("/"):
        raise ValueError(f"podman socket must be an absolute path, got {socket!r}")
    return "unix://" + socket


def image_from_attrs(attrs: dict[str, Any]) -> ContainerImage:
    """Map one libpod ``/images/json`` entry onto ``ContainerImage``."""
    image_id = str(attrs.get("Id") or "")
    tags = [t for t in attrs.get("RepoTags") or [] if t and t != "<none>:<none>"]
    reference = tags[0] if tags else image_id
    repo = reference.rsplit(":", 1)[0] if tags and ":" in reference.rsplit("/", 1)[-1] else reference
    name = repo.rsplit("/", 1)[-1] if tags else image_id[:12]
    digest = attrs.get("Digest") or (f"sha256:{image_id}" if image_id and ":" not in image_id else image_id) or None
    size = attrs.get("Size")
    labels = attrs.get("Labels") or {}
    return ContainerImage(
        name=name or reference,
        reference=reference,
        digest=str(digest) if digest else None,
        size_bytes=int(size) if isinstance(size, int | float) and size >= 0 else None,
        labels={str(k): str(v) for k, v in labels.items()},
    )


class ImageService:
    """Lists images from the podman API socket at ``podman_socket`` (None: not configured)."""

    def __init__(self, podman_socket: str | None, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.podman_socket = podman_socket
        self.timeout_s = timeout_s
        self._url = socket_url(podman_socket) if podman_socket else None

    async def list_images(self) -> ImageList:
        if self._url is None:
            return ImageList(items=[], degraded=True, reason="no podman socket configured")
        try:
            with trio.fail_after(self.timeout_s + 1):
                raw = await trio.to_thread.run_sync(self._list_sync, self._url, abandon_on_cancel=True)
        except trio.TooSlowError:
            return ImageList(items=[], degraded=True, reason=f"podman did not answer within {self.timeout_s:g} s")
        except Exception as exc:  # any podman/requests/OS failure degrades; Cancelled is a BaseException
            log.info("podman image listing failed: %r", exc)
            return ImageList(items=[], degraded=True, reason=f"podman unavailable: {_reason(exc)}")
        items: list[ContainerImage] = []
        for attrs in raw:
            try:
                items.append(image_from_attrs(attrs))
            except (TypeError, ValueError, AttributeError) as exc:
                log.warning("skipping malformed podman image entry: %r", exc)
        items.sort(key=lambda i: (i.name, i.reference))
        return ImageList(items=items)

    def _list_sync(self, url: str) -> list[dict[str, Any]]:
        # Imported here: podman-py pulls in requests, which only this path needs.
        import podman

        path = url.removeprefix("unix://")
        if not os.path.exists(path):
            raise FileNotFoundError(f"socket {path} does not exist")
        timeout = max(1, math.ceil(self.timeout_s))
        with podman.PodmanClient(base_url=url, timeout=timeout) as client:
            return [dict(image.attrs) for image in client.images.list()]


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
