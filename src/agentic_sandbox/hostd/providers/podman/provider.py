"""The container runtime: an instance is a podman container, asked for through podman-py.

What hostd makes is labelled (``org.aiwg.hostd.namespace`` = this hostd's namespace, the same one its
tree marks carry; ``org.aiwg.instance-id``; ``org.aiwg.instance-name``) and named ``aiwg-<id>``. A
restarted hostd finds each instance's container again by id (:meth:`PodmanProvider.readopt`);
containers carrying its namespace that no instance claims are *strays*: logged and reported in
``ProviderInfo.strays``, never touched.

Lifecycle: provision creates the container (image by OCI reference, resolved to the image id so the
container runs exactly what was resolved; cpu/memory/pids limits from the request; explicit
nofile/nproc rlimits, DESIGN.md §6), start starts it, stop ends the instance's sessions and execs,
then ``podman stop`` (SIGTERM, grace, SIGKILL), destroy removes it. The main process is the
request's ``command``, else the image's own, else a small idle loop that exits on SIGTERM. A
watcher (:meth:`PodmanProvider._poll`) notices containers that ended by themselves, notices podman
going away and coming back (restarting the service hostd started), and re-adopts instances whose
container it could not see when hostd started.

Sleep (``instance.sleep.freeze``) is ``podman pause``: the cgroup freezer stops every process of the
container, its memory stays. A paused container is asleep, never ended: the watcher and a re-adoption
keep its instance ``sleeping``, and tell of a container paused behind hostd's back without undoing it.
``save`` is not offered: writing a container's memory to disk takes CRIU.

Warm pools keep container slots running (:attr:`PodmanProvider.pool_form`); claims and forks:
:mod:`.copies`. Every process hostd starts inside gets the instance's identity
(``AIWG_INSTANCE_ID``, ``AGENT_INSTANCE_ID``, ``AGENT_ID``) from hostd's record, not from the
container's environment, which for a claimed slot still names the slot.

Processes inside (sessions, execs): hostd owns the PTY (or the pipes) and runs ``podman --url <socket>
exec -i [-t]`` on it, so ring, replay, lag, exit codes and reattach are the host machinery's. The
exec'd process gets the caller's env and the tree mark by name (``-e NAME``: values never appear in
an argv), so a kill finds it by its mark, inside the container, as for a host process (killing the
podman client alone would leave it running). No control channel: an fd cannot cross into the container.
"""

from __future__ import annotations

import logging
import math
import os
import posixpath
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from ...config import HostdConfig
from ...control import CONTROL_SOCKET_ENV
from ...errors import RpcError
from ...proctree import TREE_ENV
from ...statefile import mkdir_private
from ..base import ControlSocket, EndChildren, Instance, Provider, Saved, SpawnSpec
from .connection import PodmanApi, PodmanBadAnswer, PodmanUnreachable, reason
from .copies import CALL_SLACK_S, PodmanCopies, container_detail
from .labels import (
    IDLE_MAIN,
    LABEL_INSTANCE,
    LABEL_NAME,
    LABEL_NAMESPACE,
    LABEL_POOL,
    OCI_REFERENCE,
    has_own_command,
    image_ref,
    limit_options,
    settle,
)

log = logging.getLogger(__name__)

#: How often the watcher looks at podman and at this hostd's containers.
POLL_S = 2.0
#: Creating (a copy of the image's rootfs on vfs storage) and starting a container may take long.
_MAKE_TIMEOUT_S = 120.0
#: Pausing or unpausing waits for the cgroup freezer, which settles quickly unless a process hangs in
#: the kernel.
_FREEZE_TIMEOUT_S = 30.0
MAX_STRAYS = 64
CAPABILITIES = [
    "instance.start",
    "instance.stop",
    "instance.restart",
    "instance.destroy",
    "instance.fork",
    "warm_pool.manage",
    "session.pty",
    "exec",
    "instance.sleep.freeze",
]
#: Where a container sees its control directory (``<instance_dir>/control``, bound there): each
#: exec with a control channel gets its socket in it (``AIWG_CONTROL_SOCKET``).
CONTROL_DIR_INSIDE = "/run/aiwg"


class _Container:
    """The provider's record of one instance: whether hostd still has to find its container again."""

    def __init__(self, *, lost_contact: bool = False) -> None:
        #: podman could not be asked when hostd re-adopted it: the watcher settles it later.
        self.lost_contact = lost_contact


def _identity_env(info: m.InstanceInfo) -> dict[str, str]:
    env = {"AIWG_INSTANCE_ID": info.instance_id, "AGENT_INSTANCE_ID": info.instance_id}
    env["AGENT_ID"] = f"container-{info.instance_id}"
    if info.loadout:
        env["AGENT_LOADOUT"] = info.loadout
    return env


def _thaw(ref: str) -> Callable[[Any], dict[str, Any] | None]:
    """A podman call that unpauses container ``ref`` if it is paused; its record after (None: gone)."""

    def thaw(client: Any) -> dict[str, Any] | None:
        import podman.errors

        try:
            container = client.containers.get(ref)
        except podman.errors.NotFound:
            return None
        if container.status == "paused":
            container.unpause()
            container.reload()
        return dict(container.attrs)

    return thaw


def _status(attrs: Mapping[str, Any] | None) -> str:
    """podman's word for a container's state, from its record (None: there is none)."""
    return "removed" if attrs is None else str((attrs.get("State") or {}).get("Status"))


def _pid(attrs: Mapping[str, Any] | None) -> int | None:
    return ((attrs or {}).get("State") or {}).get("Pid") or None


def _record(instance: Instance) -> _Container:
    if not isinstance(instance.state, _Container):
        instance.state = _Container()
    return instance.state


class PodmanProvider(Provider):
    """Containers on the podman API socket of ``config.podman_socket``. The watcher runs in
    ``nursery`` (owned by hostd's registry, outliving connections)."""

    runtime = "container"
    name = "podman"
    pool_form = "running"

    def __init__(self, config: HostdConfig, nursery: trio.Nursery, commit: Callable[[Instance], None]) -> None:
        super().__init__(commit)
        self._config = config
        self._nursery = nursery
        self._api = PodmanApi(config)
        self._reason: str | None = "podman has not been asked yet"
        self._contact_checked = False
        self._known: dict[str, Instance] = {}
        self._copies = PodmanCopies(config, self._known, call=self._call, provision=self.provision, start=self.start)
        self._strays: list[str] = []

    # -- instances made from others (see .copies) ---------------------------------------------------

    async def take_identity(self, instance: Instance, slot_id: str) -> None:
        await self._copies.take_identity(instance, slot_id)

    async def fork(self, source: Instance, instance: Instance) -> None:
        await self._copies.fork(source, instance)

    # -- what it is -----------------------------------------------------------------------------

    def capabilities(self) -> list[str]:
        return list(CAPABILITIES)

    def instance_capabilities(self, info: m.InstanceInfo) -> list[str]:
        # A container made with a control directory gives its execs a control channel.
        control = info.container is not None and info.container.control
        return [*CAPABILITIES, "exec.control"] if control else list(CAPABILITIES)

    def availability(self) -> str | None:
        if self._api.binary is None:
            return "podman is not installed (no podman on PATH)"
        if not self._api.url:
            return "no podman socket configured (AIWG_PODMAN_SOCKET)"
        return self._reason

    def describe(self, *, default: bool) -> m.ProviderInfo:
        info = super().describe(default=default)
        info.strays = list(self._strays)
        return info

    async def _check_contact(self) -> None:
        """Ask podman once (starting the service when configured) before the first readopt."""
        if not self._contact_checked:
            self._contact_checked = True
            self._reason = await self._api.ensure_service()
            if self._reason is not None:
                log.warning("podman is not available: %s", self._reason)
            else:
                log.info("podman answers on %s", self._api.url)

    async def startup(self) -> None:
        await self._check_contact()
        if not self._api.url:
            return  # nothing to watch: the provider stays unavailable, saying why
        if self._reason is None:
            await self._poll()  # strays and settled states before hostd says it is ready
        self._nursery.start_soon(self._watch)

    async def shutdown(self) -> None:
        await self._api.close()

    # -- podman calls ---------------------------------------------------------------------------

    async def _call(self, fn: Callable[[Any], Any], *, timeout_s: float | None = None) -> Any:
        """One podman call; unreachable becomes ``provider.unavailable`` (and is remembered), podman's
        own refusals ``provider.failed``."""
        import podman.errors

        try:
            result = await self._api.call(fn, timeout_s=timeout_s)
        except PodmanUnreachable as exc:
            self._reason = str(exc)
            raise RpcError(
                ErrorCode.PROVIDER_UNAVAILABLE, f"podman is not available: {exc}", runtime=self.runtime
            ) from exc
        except podman.errors.ImageNotFound as exc:
            raise RpcError(ErrorCode.IMAGE_NOT_FOUND, f"podman has no such image: {reason(exc)}") from exc
        except podman.errors.APIError as exc:
            raise RpcError(ErrorCode.PROVIDER_FAILED, f"podman refused: {reason(exc)}") from exc
        except PodmanBadAnswer as exc:
            raise RpcError(ErrorCode.PROVIDER_FAILED, str(exc)) from exc
        self._reason = None
        return result

    # -- lifecycle ------------------------------------------------------------------------------

    async def provision(self, instance: Instance, req: m.InstanceProvisionRequest) -> None:
        info = instance.info
        instance.state = _Container()
        if req.image is None:
            raise RpcError(ErrorCode.REQUEST_INVALID, "a container instance needs an image", field="image")
        if not OCI_REFERENCE.match(req.image):
            message = f"image {req.image!r} is not an OCI reference (name[:tag][@sha256:<hex>])"
            raise RpcError(ErrorCode.REQUEST_INVALID, message, field="image")
        image_name = req.image
        working_dir = req.working_dir or "/"
        if not posixpath.isabs(working_dir):
            raise RpcError(
                ErrorCode.WORKING_DIR_NOT_FOUND,
                f"working_dir {working_dir!r} must be an absolute path inside the container",
                working_dir=working_dir,
            )
        info.working_dir = posixpath.normpath(working_dir)
        info.instance_dir = str(self._config.instances_dir / info.instance_id)
        mkdir_private(Path(info.instance_dir))
        control_dir = Path(info.instance_dir) / "control"
        control_dir.mkdir(mode=0o711, exist_ok=True)  # a non-root user inside reaches its socket
        control_dir.chmod(0o711)
        name = f"aiwg-{info.instance_id}"
        info.container = m.ContainerDetail(container_name=name, image=image_name, limits=req.limits, control=True)
        self._known[info.instance_id] = instance
        env = {**_identity_env(info), **instance.env}
        labels = {
            **info.labels,
            LABEL_NAMESPACE: self._config.namespace,
            LABEL_INSTANCE: info.instance_id,
            LABEL_NAME: info.name,
            **({LABEL_POOL: info.pool} if info.pool else {}),
        }
        options = limit_options(req.limits, nofile=self._config.container_nofile, nproc=self._config.container_nproc)
        command = info.command

        def create(client: Any) -> tuple[str, str]:
            image = client.images.get(image_name)
            container = client.containers.create(
                image.id,  # exactly what was resolved, whatever the tag points at later
                command=command or (None if has_own_command(image.attrs) else IDLE_MAIN),
                name=name,
                labels=labels,
                environment=env,
                working_dir=info.working_dir,
                mounts=[{"type": "bind", "source": str(control_dir), "target": CONTROL_DIR_INSIDE}],
                **options,
            )
            return container.id, image_ref(image.attrs, image_name)

        container_id, resolved = await self._call(create, timeout_s=_MAKE_TIMEOUT_S)
        detail = container_detail(instance)
        detail.container_id, detail.image_ref, detail.status = container_id, resolved, "created"

    async def start(self, instance: Instance) -> None:
        info, detail = instance.info, container_detail(instance)
        info.state = "starting"
        name = detail.container_name

        def start(client: Any) -> dict[str, Any]:
            container = client.containers.get(name)
            container.start()
            container.reload()
            return dict(container.attrs)

        try:
            attrs = await self._call(start, timeout_s=_MAKE_TIMEOUT_S)
        except RpcError as exc:
            info.state, info.note, info.stopped_at = "failed", exc.message, time.time()
            raise
        state = attrs.get("State") or {}
        detail.status, detail.pid = state.get("Status"), state.get("Pid") or None
        now = time.time()
        if detail.status == "running":
            info.state, info.started_at, info.stopped_at = "running", now, None
            info.exit_code = info.adopted = info.note = None
        else:
            info.state, info.stopped_at, info.exit_code = "failed", now, state.get("ExitCode")
            info.note = f"container {name} is {detail.status} right after its start"
            raise RpcError(ErrorCode.SPAWN_FAILED, info.note)

    async def stop(self, instance: Instance, grace_s: float, end_children: EndChildren) -> None:
        detail = container_detail(instance)
        if detail.status == "paused":
            # The registry wakes a sleeping instance first; one paused by someone else is thawed
            # here, as what runs in it cannot end while frozen.
            await self._thaw_quietly(instance)
        await end_children()
        name = detail.container_name
        timeout = max(0, math.ceil(grace_s))

        def stop(client: Any) -> dict[str, Any]:
            import podman.errors

            try:
                container = client.containers.get(name)
            except podman.errors.NotFound:
                return {}
            if container.status == "paused":
                container.unpause()  # podman refuses to stop a paused container
                container.reload()
            if container.status == "running":
                container.stop(timeout=timeout)
                container.reload()
            return dict(container.attrs)

        try:
            attrs = await self._call(stop, timeout_s=timeout + CALL_SLACK_S)
        finally:
            detail.pid = None
        state = attrs.get("State") or {}
        detail.status = state.get("Status", "removed")
        instance.info.exit_code = state.get("ExitCode")

    async def discard(self, instance: Instance) -> None:
        info = instance.info
        if info.container is not None:
            ref = info.container.container_id or info.container.container_name
            owned = info.container.owned_image

            def remove(client: Any) -> None:
                import podman.errors

                try:
                    client.containers.get(ref).remove(force=True)
                except podman.errors.NotFound:
                    pass
                if owned is not None:
                    try:
                        client.images.remove(owned, force=True)
                    except podman.errors.ImageNotFound:
                        pass

            try:
                await self._call(remove, timeout_s=CALL_SLACK_S + self._config.stop_grace_s)
            except RpcError as exc:
                # The instance is gone for hostd either way; what podman still holds shows as a stray.
                log.error("instance %s: container %s not removed: %s", info.instance_id, ref, exc.message)
        # Forgotten only now: a watcher round meanwhile must not take its container for a stray.
        self._known.pop(info.instance_id, None)
        if info.instance_dir:
            await trio.to_thread.run_sync(shutil.rmtree, info.instance_dir, True)

    # -- sleep: podman pause (the cgroup freezer) --------------------------------------------------

    async def sleep(self, instance: Instance, how: m.SleepForm) -> None:
        if how != "freeze":
            await super().sleep(instance, how)  # refuses: saving a container's memory takes CRIU
        detail = container_detail(instance)
        name = detail.container_name
        ref = detail.container_id or name

        def pause(client: Any) -> dict[str, Any] | None:
            import podman.errors

            try:
                container = client.containers.get(ref)
            except podman.errors.NotFound:
                return None
            if container.status == "running":
                container.pause()
                container.reload()
            return dict(container.attrs)

        try:
            attrs = await self._call(pause, timeout_s=_FREEZE_TIMEOUT_S)
        except RpcError as exc:
            await self._thaw_quietly(instance)  # a pause that timed out may still take effect
            raise RpcError(exc.code, f"container {name} could not be paused: {exc.message}", **exc.details) from exc
        status = _status(attrs)
        if status != "paused":
            self._settle(instance, attrs, adopting=False)  # ended meanwhile: stopped or failed
            raise RpcError(ErrorCode.PROVIDER_FAILED, f"container {name} could not be paused: it is {status}")
        detail.status = "paused"

    async def wake(self, instance: Instance, how: m.SleepForm) -> None:
        if how != "freeze":
            await super().wake(instance, how)
        detail = container_detail(instance)
        name = detail.container_name
        try:
            attrs = await self._call(_thaw(detail.container_id or name), timeout_s=_FREEZE_TIMEOUT_S)
        except RpcError as exc:
            raise RpcError(exc.code, f"container {name} could not be unpaused: {exc.message}", **exc.details) from exc
        status = _status(attrs)
        if status != "running":
            self._settle(instance, attrs, adopting=False)  # ended or gone while asleep
            raise RpcError(ErrorCode.PROVIDER_FAILED, f"container {name} could not be unpaused: it is {status}")
        detail.status, detail.pid = "running", _pid(attrs) or detail.pid

    async def _thaw_quietly(self, instance: Instance) -> None:
        """Unpause the container if it is paused, logging a failure: a best effort on the way to
        something else (a stop; a sleep that failed, left running)."""
        detail = container_detail(instance)
        try:
            await self._call(_thaw(detail.container_id or detail.container_name))
        except RpcError as exc:
            log.warning("instance %s: container %s not unpaused: %s", instance.id, detail.container_name, exc.message)

    async def readopt(self, instance: Instance, saved: Saved) -> None:
        info = instance.info
        self._known[info.instance_id] = instance
        if info.container is None:  # cut off before its container existed
            info.state, info.adopted, info.note = "failed", False, "no container was created"
            return
        await self._check_contact()
        if self._reason is not None:
            if info.state in ("running", "starting", "stopping", "sleeping"):
                self._lose_contact(instance, f"podman was not reachable when hostd started: {self._reason}")
            return
        try:
            attrs = await self._inspect(info.container.container_id or info.container.container_name)
        except RpcError as exc:
            self._lose_contact(instance, exc.message)
            return
        self._settle(instance, attrs, adopting=True)
        if info.state == "running" and info.container.status == "paused":
            # Paused with its instance awake: a sleep that hostd went down in the middle of (the
            # pause done, the record not written). Nothing could run in it: thawed.
            await self._thaw_quietly(instance)
            info.container.status = "running"

    def _lose_contact(self, instance: Instance, note: str) -> None:
        """Its container could not be asked for: the watcher settles it once podman answers. A
        sleeping instance stays ``sleeping`` meanwhile (nothing runs in it either way)."""
        info = instance.info
        _record(instance).lost_contact = True
        if info.state != "sleeping":
            info.state = "failed"
        info.adopted, info.note = False, note

    async def _inspect(self, name: str) -> dict[str, Any] | None:
        def inspect(client: Any) -> dict[str, Any] | None:
            import podman.errors

            try:
                return dict(client.containers.get(name).attrs)
            except podman.errors.NotFound:
                return None

        result: dict[str, Any] | None = await self._call(inspect)
        return result

    def _settle(self, instance: Instance, attrs: Mapping[str, Any] | None, *, adopting: bool) -> bool:
        """Fold podman's record of the container into the instance (:func:`.labels.settle`), knowing
        what that does not: a paused container is frozen, not ended. True if anything changed."""
        _record(instance).lost_contact = False
        info, detail = instance.info, container_detail(instance)
        before = (info.state, info.note, info.adopted, info.sleep, detail.status, detail.pid)
        state = dict(attrs.get("State") or {}) if attrs is not None else {}
        status = state.get("Status")
        if attrs is not None and status == "paused":
            # Read as running, so that settle adopts it as such and takes no exit from it.
            attrs = {**attrs, "State": {**state, "Status": "running"}}
        if info.state == "sleeping" and (status == "paused" or (status == "running" and not adopting)):
            settle(info, detail, attrs, adopting=False)  # asleep as hostd left it: only the detail
            if adopting:
                info.adopted, info.note = True, None
            elif status == "running" and before[4] != "running":
                # Unpaused by someone else: left to its next wake, which finds it running.
                log.warning("instance %s sleeps, but container %s is running", info.instance_id, detail.container_name)
        else:
            if info.state == "sleeping":
                # Found running after a restart, or ended, or gone: it sleeps no more, and the rules
                # for a running instance say what it is now.
                info.state, info.sleep = "running", None
            settle(info, detail, attrs, adopting=adopting)
        if status == "paused":
            detail.status = "paused"
            if info.state != "sleeping" and before[4] != "paused":
                log.warning(
                    "instance %s is %s, but container %s is paused (not by hostd); left as it is",
                    info.instance_id,
                    info.state,
                    detail.container_name,
                )
        return before != (info.state, info.note, info.adopted, info.sleep, detail.status, detail.pid)

    # -- the watcher ----------------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await trio.sleep(POLL_S)
            try:
                await self._poll()
            except Exception:
                log.exception("podman watcher: one round failed")

    async def _poll(self) -> None:
        """One look at podman: reachable? (restarting the service hostd runs), containers that ended
        by themselves, instances to re-adopt, strays."""
        was = self._reason
        self._reason = await self._api.ensure_service()
        if self._reason is not None:
            if was is None:
                log.warning("podman is not available any more: %s", self._reason)
            return
        if was is not None:
            log.info("podman answers again on %s", self._api.url)
        namespace = self._config.namespace

        def listing(client: Any) -> list[dict[str, Any]]:
            return [
                dict(c.attrs)
                for c in client.containers.list(all=True, filters={"label": f"{LABEL_NAMESPACE}={namespace}"})
            ]

        try:
            containers = await self._call(listing)
        except RpcError:
            return
        # A container is matched by its id, and by its instance label only while its instance has no
        # container id recorded yet (being made): claimed pool slots keep the labels they were made
        # with, and a container run from a commit of one of ours carries its labels too.
        by_id = {i.info.container.container_id: iid for iid, i in self._known.items() if i.info.container}
        by_instance: dict[str, dict[str, Any]] = {}
        strays, unclaimed_slots = [], []
        for attrs in containers:
            labels = attrs.get("Labels") or {}
            names = attrs.get("Names") or [str(attrs.get("Id", ""))[:12]]
            iid = by_id.get(attrs.get("Id"))
            label_iid = labels.get(LABEL_INSTANCE)
            if iid is None and label_iid in self._known:
                detail = self._known[label_iid].info.container
                iid = label_iid if detail is None or detail.container_id is None else None
            if iid is not None:
                by_instance[iid] = attrs
            elif labels.get(LABEL_POOL) and label_iid not in self._known and f"aiwg-{label_iid}" in names:
                unclaimed_slots.append(str(attrs.get("Id")))  # made as a slot, never recorded: never handed out
            else:
                strays.append(str(names[0]))
        await self._copies.remove_unclaimed(unclaimed_slots)
        strays.sort()
        if strays != self._strays:
            if strays:
                log.warning("containers labelled as this hostd's that no instance claims: %s", ", ".join(strays))
            self._strays = strays[:MAX_STRAYS]
        for iid, instance in list(self._known.items()):
            if instance.lock.locked() or instance.info.container is None:
                continue  # a lifecycle call is at work on it and records the outcome itself
            state = instance.info.state
            if state not in ("running", "starting", "sleeping") and not _record(instance).lost_contact:
                continue
            attrs = by_instance.get(iid)
            if attrs is not None:
                # The listing's entry has no exit code, and may predate a sleep or a wake: ask for the
                # whole record of one that is not as hostd left it.
                status = attrs.get("State")
                if status != ("paused" if state == "sleeping" else "running"):
                    try:
                        detail = instance.info.container
                        attrs = await self._inspect(detail.container_id or detail.container_name)
                    except RpcError:
                        continue
                else:
                    attrs = {**attrs, "State": {"Status": status, "Pid": attrs.get("Pid")}}
            if instance.lock.locked():
                continue
            if self._settle(instance, attrs, adopting=_record(instance).lost_contact):
                self._commit(instance)

    # -- processes inside -----------------------------------------------------------------------

    def spawn_spec(
        self, instance: Instance, argv: Sequence[str], cwd: str | None, env: Mapping[str, str], *, tty: bool
    ) -> SpawnSpec:
        info, detail = instance.info, container_detail(instance)
        if self._api.binary is None:
            raise RpcError(ErrorCode.PROVIDER_UNAVAILABLE, "podman is not installed (no podman on PATH)")
        shown = posixpath.normpath(posixpath.join(info.working_dir, cwd or ""))
        command = [self._api.binary, "--url", self._api.url, "exec", "-i"]
        if tty:
            command.append("-t")
        # The identity comes from hostd's record: a claimed pool slot's container env names the slot.
        env = {**_identity_env(info), **env}
        command += ["-w", shown, "-e", TREE_ENV]
        for key in env:
            command += ["-e", key]
        command += ["--", detail.container_id or detail.container_name, *argv]
        host_env = {
            "PATH": os.environ.get("PATH") or "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": info.instance_dir,
            "LANG": "C.UTF-8",
            **env,
        }
        return SpawnSpec(argv=command, cwd=info.instance_dir, env=host_env, shown_cwd=shown, proxied=True)

    def control_socket(self, instance: Instance, exec_id: str) -> ControlSocket | None:
        if not container_detail(instance).control:
            return None
        # Under the instance's directory as it is now (a claimed pool slot's directory is renamed:
        # the container's bind follows the directory itself).
        name = f"{exec_id}.sock"
        host_path = f"{instance.info.instance_dir}/control/{name}"
        return ControlSocket(host_path=host_path, inside_env={CONTROL_SOCKET_ENV: f"{CONTROL_DIR_INSIDE}/{name}"})
