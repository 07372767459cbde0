"""The container-image catalog, as hostd reports it (only hostd talks to podman).

A thin service over the link: hostd lists the images of its podman API socket (see
``hostd.providers.podman.images``). Two kinds of "cannot" are kept apart on purpose:

* podman cannot be asked (none configured, socket missing, refused, too slow): hostd answers, with
  an empty list, ``degraded: true`` and the reason. The catalog is advisory, so this is a 200.
* hostd itself cannot be asked: :meth:`HostdLink.call` raises ``Unavailable`` and the route fails
  closed with 503 ``internal.unavailable``, like every other hostd-backed route. A cached or empty
  list would present "we do not know" as an answer.
"""

from __future__ import annotations

from agentic_sandbox.proto import messages as m

from ..hostlink import HostdLink


class ImageService:
    def __init__(self, link: HostdLink) -> None:
        self.link = link

    async def list_images(self) -> m.ImageListResponse:
        """hostd's image list (sorted by name, then reference), possibly degraded."""
        listing: m.ImageListResponse = await self.link.call(m.ImageListRequest())
        return listing
