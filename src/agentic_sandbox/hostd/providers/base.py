"""The interface every runtime provider implements, and the instance record it shares with the registry.

General layout: the registry (:mod:`hostd.instances`) owns the table of instances, one lock per
instance, the lifecycle state machine, the state file, and the hooks that end an instance's sessions
and execs; it knows no runtime's details. A :class:`Provider` owns what one runtime kind means: how an
instance is made, started, stopped, removed and found again after a hostd restart, what its
instances can do, and how a process or a PTY process starts inside one (:meth:`Provider.spawn_spec`).
Providers mirror each other method for method (``host.py`` first; containers and VMs follow).

Calling rules:

* The registry calls ``provision``, ``start``, ``stop``, ``discard`` and ``readopt`` with the
  instance's lock held, so a provider never sees two of them at once for one instance. ``stop`` and
  ``discard`` run shielded from cancellation: half a stop would leave a half-killed instance.
* A provider writes what it learns into ``instance.info`` (state, note, timestamps, its detail) and
  reports a change it notices by itself, outside any call (a main process that exited, a container that
  died), through the ``commit`` callback it was given, which persists it.
* Failures the caller should hear about are :class:`hostd.errors.RpcError`; anything else is a bug.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import msgspec
import trio

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from ..errors import RpcError


class SpawnSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How hostd starts one process inside an instance, as its provider decided.

    ``argv``, ``cwd`` and ``env`` are what hostd execs on the host: the request's own for a host
    instance, a wrapper (``podman exec``, a console client) for others. ``shown_cwd`` is the working
    directory as the instance sees it, reported back to callers. The process tree gets its own cgroup
    below ``cgroup_parent`` when that is set (None: process group and tree mark only). Never encoded,
    so a Path is fine here.
    """

    argv: list[str]
    cwd: str
    env: dict[str, str]
    shown_cwd: str
    cgroup_parent: Path | None = None
    #: The process hostd execs is a client standing in for the real one (``podman exec``): signals
    #: go to the tree's marked processes other than it, and when it ends what is left of its tree
    #: (inside the instance, where no hangup reaches) is killed.
    proxied: bool = False


class ControlSocket(msgspec.Struct, frozen=True, kw_only=True):
    """How an exec's control channel reaches into the instance when an fd cannot: hostd listens at
    ``host_path``, and the child (whose environment gets ``inside_env``, and whose argv starts with
    ``argv_prefix``) ends up connected to it: a container's child connects to the path bound into
    it (``AIWG_CONTROL_SOCKET``); a VM's is started by the guest's helper, whose channel the
    provider relays to ``host_path``."""

    host_path: str
    inside_env: dict[str, str] = {}
    argv_prefix: list[str] = []


class Instance:
    """The registry's record of one instance. ``info`` is the public view; ``env`` the env the
    instance was provisioned with; ``state`` belongs to the provider (its own per-instance record)."""

    def __init__(self, info: m.InstanceInfo, env: dict[str, str], provider: Provider) -> None:
        self.info = info
        self.env = env
        self.provider = provider
        self.lock = trio.Lock()
        self.state: object = None

    @property
    def id(self) -> str:
        return self.info.instance_id


#: Persisted per-instance data a provider keeps in the state file (see :meth:`Provider.saved`).
Saved = dict[str, object]

#: Ends every session and exec of the instance (the registry's stop hooks), given a grace period.
EndChildren = Callable[[], Awaitable[None]]


class Provider(abc.ABC):
    """One runtime kind (``runtime``) as implemented by one provider (``name``). See the module
    docstring for the calling rules."""

    runtime: ClassVar[str]
    name: ClassVar[str]
    #: How a warm pool keeps this provider's slots: ``running`` (made and started, claimed as they
    #: are) or ``saved`` (booted, then checkpointed; a claim restores one). None: no warm pools.
    pool_form: ClassVar[str | None] = None

    def __init__(self, commit: Callable[[Instance], None]) -> None:
        self._commit = commit
        #: What checkpoints hold (VM domain UUIDs), so a provider looking for strays does not count
        #: them; set by the registry.
        self.held_elsewhere: Callable[[], set[str]] = set

    # -- what it is -----------------------------------------------------------------------------

    @abc.abstractmethod
    def capabilities(self) -> list[str]:
        """What instances of this provider can do (``instance.start``, ``session.pty``, ...)."""

    def instance_capabilities(self, info: m.InstanceInfo) -> list[str]:
        """What this one instance can do: :meth:`capabilities`, less what its own make-up rules out."""
        return self.capabilities()

    def availability(self) -> str | None:
        """None if new instances can be provisioned now, else why not."""
        return None

    def describe(self, *, default: bool) -> m.ProviderInfo:
        reason = self.availability()
        return m.ProviderInfo(
            runtime=self.runtime,
            provider=self.name,
            available=reason is None,
            reason=reason,
            capabilities=self.capabilities(),
            default=default,
        )

    # -- lifecycle (lock held) ------------------------------------------------------------------

    @abc.abstractmethod
    async def provision(self, instance: Instance, req: m.InstanceProvisionRequest) -> None:
        """Make what the instance needs, without starting it. On error the registry calls
        :meth:`discard` and forgets the instance."""

    @abc.abstractmethod
    async def start(self, instance: Instance) -> None:
        """Start it; leaves ``info.state`` ``running`` (or ``failed`` with a note, raising)."""

    @abc.abstractmethod
    async def stop(self, instance: Instance, grace_s: float, end_children: EndChildren) -> None:
        """End everything that runs in it: ``end_children`` first (sessions, execs), then the
        instance's own processes (SIGTERM, ``grace_s``, SIGKILL). The registry then marks it stopped."""

    @abc.abstractmethod
    async def discard(self, instance: Instance) -> None:
        """Remove whatever is left of it (processes, files, cgroups, containers). Idempotent."""

    @abc.abstractmethod
    async def readopt(self, instance: Instance, saved: Saved) -> None:
        """After a hostd restart: find what still runs and set ``info`` honestly (``adopted``,
        ``note``, ``failed`` for what died meanwhile). ``saved`` is what :meth:`saved` returned.
        An instance persisted ``sleeping`` (``info.sleep`` says how) stays ``sleeping`` if it still
        sleeps that way, else gets the state it is found in."""

    def saved(self, instance: Instance) -> Saved:
        """What the state file must keep for :meth:`readopt` (beside ``info`` and ``env``)."""
        return {}

    def record(self, instance: Instance) -> None:  # noqa: B027 - optional hook
        """The registry committed a change of ``instance``: update the provider's own record of it
        (e.g. a metadata file). Failures are logged, never raised."""

    async def startup(self) -> None:  # noqa: B027 - optional hook, most providers need nothing
        """Every instance of the state file was re-adopted: start what the provider runs by itself
        (watchers) in the nursery it was given. Awaited before hostd says it is ready."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook, most providers need nothing
        """hostd is going away; instances keep running (they are re-adopted by the next hostd)."""

    # -- checkpoints (lock held; only with ``instance.snapshot`` / ``instance.restore``) ---------

    async def checkpoint(self, instance: Instance, path: Path) -> Saved:
        """Save the running instance's state to ``path`` and let go of the instance (the registry
        forgets it: what ran in it lives in the checkpoint now). Returns what :meth:`restore` needs."""
        raise RpcError(ErrorCode.UNSUPPORTED, f"{self.runtime}/{self.name} instances cannot be checkpointed")

    async def restore(self, instance: Instance, saved: Saved, path: Path) -> None:
        """Bring the state saved at ``path`` back as ``instance`` (new id, name), running."""
        raise RpcError(ErrorCode.UNSUPPORTED, f"{self.runtime}/{self.name} cannot restore checkpoints")

    async def drop_checkpoint(self, saved: Saved) -> None:  # noqa: B027 - optional hook
        """A checkpoint is being thrown away unrestored: remove what :meth:`checkpoint` left behind
        besides its file (a VM's defined, shut-off domain)."""

    # -- sleep (lock held; only with ``instance.sleep.freeze`` / ``instance.sleep.save``) --------

    async def sleep(self, instance: Instance, how: m.SleepForm) -> None:
        """Put the running instance to sleep ``how``: ``freeze`` stops every process in it and keeps
        its memory; ``save`` writes its memory to disk and frees it. Returns once it sleeps; on error
        it is left running (or ``failed`` with a note) and the error raised. The registry sets
        ``info.state`` and ``info.sleep``; a watcher of the provider must not take a sleeping
        instance for a dead one."""
        raise RpcError(ErrorCode.UNSUPPORTED, f"{self.runtime}/{self.name} instances cannot sleep {how}")

    async def wake(self, instance: Instance, how: m.SleepForm) -> None:
        """Bring the instance asleep ``how`` back, running as it was (sessions, execs, connections
        of the provider's own reattached). Raises ``RpcError`` saying why it could not; the registry
        then asks :meth:`readopt`-style questions no further: the instance is left ``sleeping`` if
        the provider left it asleep, else what the provider set."""
        raise RpcError(ErrorCode.UNSUPPORTED, f"{self.runtime}/{self.name} instances cannot wake from {how}")

    # -- fork and warm pools (source lock held; only with ``instance.fork`` / ``warm_pool.manage``) --

    async def fork(self, source: Instance, instance: Instance) -> None:
        """Make ``instance`` (new id, name; nothing made yet) a running copy of the running ``source``.
        On error the registry calls :meth:`discard` on ``instance``."""
        raise RpcError(ErrorCode.UNSUPPORTED, f"{self.runtime}/{self.name} instances cannot be forked")

    async def wait_usable(self, instance: Instance) -> None:  # noqa: B027 - optional hook
        """Until a freshly started pool slot is ready to be handed out (a VM's guest has booted)."""

    async def take_identity(self, instance: Instance, slot_id: str) -> None:  # noqa: B027 - optional hook
        """A running pool slot (``slot_id``) became ``instance`` (``info`` carries the new id and
        name): rename what the provider made for it. Called with the instance's lock held."""

    # -- processes inside an instance -----------------------------------------------------------

    @abc.abstractmethod
    def spawn_spec(
        self, instance: Instance, argv: Sequence[str], cwd: str | None, env: Mapping[str, str], *, tty: bool
    ) -> SpawnSpec:
        """How to start ``argv`` inside the running instance with ``env`` added to the instance's own,
        in ``cwd`` (relative: below the instance's working dir; None: the working dir).

        Raises ``RpcError(WORKING_DIR_NOT_FOUND)`` for a cwd the instance does not have.
        """

    def control_socket(self, instance: Instance, exec_id: str) -> ControlSocket | None:
        """Where exec ``exec_id``'s control channel is reached, when it is a socket to connect to;
        None (the default): the channel is an fd the child inherits (``AIWG_CONTROL_FD``)."""
        return None


class AbsentProvider(Provider):
    """Stands in for a provider this hostd does not offer (any more) for instances of the state file.

    Such an instance is kept, ``failed``, with what its provider saved, so a hostd that offers the
    provider again re-adopts it; every lifecycle call is refused with ``provider.unavailable``.
    """

    def __init__(self, runtime: str, name: str) -> None:
        super().__init__(lambda _instance: None)
        self.runtime = runtime  # type: ignore[misc]  # per instance, not per class, here
        self.name = name  # type: ignore[misc]

    def capabilities(self) -> list[str]:
        return []

    def availability(self) -> str | None:
        return f"provider {self.runtime}/{self.name} is not offered by this hostd"

    def _refuse(self) -> RpcError:
        return RpcError(ErrorCode.PROVIDER_UNAVAILABLE, self.availability(), runtime=self.runtime, provider=self.name)

    async def provision(self, instance: Instance, req: m.InstanceProvisionRequest) -> None:
        raise self._refuse()

    async def start(self, instance: Instance) -> None:
        raise self._refuse()

    async def stop(self, instance: Instance, grace_s: float, end_children: EndChildren) -> None:
        raise self._refuse()

    async def discard(self, instance: Instance) -> None:
        raise self._refuse()

    async def readopt(self, instance: Instance, saved: Saved) -> None:
        instance.state = dict(saved)
        instance.info.state, instance.info.adopted = "failed", False
        instance.info.note = self.availability()

    def saved(self, instance: Instance) -> Saved:
        return dict(instance.state) if isinstance(instance.state, dict) else {}

    def spawn_spec(
        self, instance: Instance, argv: Sequence[str], cwd: str | None, env: Mapping[str, str], *, tty: bool
    ) -> SpawnSpec:
        raise self._refuse()
