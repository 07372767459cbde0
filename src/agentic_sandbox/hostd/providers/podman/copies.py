"""Container instances made from other containers (the fork), and warm pool slots becoming instances.

* A claim (:meth:`PodmanCopies.take_identity`) renames the slot's container ``aiwg-<new id>`` in one
  podman call. podman cannot change a container's labels, so a claimed slot keeps the labels it
  was made with (``org.aiwg.instance-id`` names the slot): hostd finds its containers by id, and
  its record holds the instance's labels.
* A fork (``instance.fork``) commits the running source's filesystem (``podman commit``, which
  pauses it for the copy) into an image of the fork's own (``localhost/aiwg-fork:<id>``, removed
  with the fork) and starts a new container of it with the source's command, limits and env: files
  are copied, processes and memory are not (that would take CRIU, which does not work on every
  kernel).
* A container made as a pool slot (labelled ``org.aiwg.pool``, named after its slot) that no
  instance holds was never handed to anyone (a fill cut off by a crash): the watcher removes it
  (:meth:`PodmanCopies.remove_unclaimed`).

The container provider holds a :class:`PodmanCopies`, handing it what it uses when it builds it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from agentic_sandbox.proto import messages as m

from ...config import HostdConfig
from ...errors import RpcError
from ..base import Instance
from .labels import LABEL_POOL

log = logging.getLogger(__name__)

#: A fork's image: committed from its source, removed with the fork.
FORK_REPOSITORY = "localhost/aiwg-fork"
#: Committing a container's filesystem (vfs storage copies every file) may take long.
_COMMIT_TIMEOUT_S = 300.0
#: Extra time a podman call gets beyond the grace of a stop.
CALL_SLACK_S = 10.0


def container_detail(instance: Instance) -> m.ContainerDetail:
    detail = instance.info.container
    assert detail is not None, "a container instance always has its detail"
    return detail


Call = Callable[..., Awaitable[Any]]


class PodmanCopies:
    """See the module docstring. ``known`` is the provider's table of its containers' instances;
    ``call`` runs a podman-py call in a worker thread (bounded, errors translated); ``provision``
    and ``start`` are the provider's own, which a fork's new container goes through."""

    def __init__(
        self,
        config: HostdConfig,
        known: dict[str, Instance],
        *,
        call: Call,
        provision: Callable[[Instance, m.InstanceProvisionRequest], Awaitable[None]],
        start: Callable[[Instance], Awaitable[None]],
    ) -> None:
        self._config = config
        self._known = known
        self._call = call
        self._provision = provision
        self._start = start

    async def take_identity(self, instance: Instance, slot_id: str) -> None:
        """Rename the slot's container after its new instance (a few ms: the claim stays fast)."""
        detail = container_detail(instance)
        new_name = f"aiwg-{instance.info.instance_id}"
        ref = detail.container_id or detail.container_name

        def rename(client: Any) -> None:
            # One API call (podman-py's Container.rename would inspect the container first).
            client.api.post(f"/containers/{ref}/rename", params={"name": new_name}).raise_for_status()

        await self._call(rename)
        detail.container_name = new_name
        self._known.pop(slot_id, None)
        self._known[instance.info.instance_id] = instance

    async def fork(self, source: Instance, instance: Instance) -> None:
        """Commit the source's filesystem into the fork's own image, then provision and start a
        container of it (module docstring: files are copied, processes are not)."""
        src = container_detail(source)
        info = instance.info
        tag = info.instance_id.lower()
        ref = src.container_id or src.container_name

        def commit(client: Any) -> str:
            # The container's labels go into the image: a fork is nobody's pool slot.
            changes = [f"LABEL {LABEL_POOL}="]
            image = client.containers.get(ref).commit(repository=FORK_REPOSITORY, tag=tag, pause=True, changes=changes)
            return str(image.id)

        image_id = await self._call(commit, timeout_s=_COMMIT_TIMEOUT_S)
        try:
            req = m.InstanceProvisionRequest(
                instance_id=info.instance_id,
                name=info.name,
                runtime=source.info.runtime,
                provider=source.info.provider,
                working_dir=source.info.working_dir,
                command=list(source.info.command) if source.info.command else None,
                image=f"{FORK_REPOSITORY}:{tag}",
                limits=src.limits,
            )
            instance.env = dict(source.env)
            await self._provision(instance, req)
        finally:
            if instance.info.container is not None:
                instance.info.container.owned_image = image_id
        await self._start(instance)

    async def remove_unclaimed(self, container_ids: list[str]) -> None:
        """Containers made as pool slots that no instance holds: a fill cut off by a crash before
        hostd recorded it. Nobody was ever handed them, so they go (a stray is only reported)."""
        if not container_ids:
            return

        def remove(client: Any) -> None:
            import podman.errors

            for cid in container_ids:
                try:
                    client.containers.get(cid).remove(force=True)
                except podman.errors.NotFound:
                    pass

        log.info("removing %d container(s) made as warm pool slots that nothing holds", len(container_ids))
        try:
            await self._call(remove, timeout_s=CALL_SLACK_S + self._config.stop_grace_s)
        except RpcError as exc:
            log.warning("unclaimed pool slot containers not removed yet: %s", exc.message)
