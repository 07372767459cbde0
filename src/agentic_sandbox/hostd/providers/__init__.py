"""Runtime providers: one module per runtime kind, each implementing :class:`base.Provider`.

``host`` (a supervised process tree on the host itself) is the first, ``container`` (podman) and
``vm`` (libvirt domains) the next; ``make_providers`` builds
the ones this hostd offers, keyed by ``(runtime, provider)``, with each runtime's default first.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from ..config import HostdConfig
from ..proctree import Cgroups
from .base import AbsentProvider, ControlSocket, Instance, Provider, Saved, SpawnSpec
from .host.provider import HostProvider
from .libvirt.provider import VmProvider
from .podman.provider import PodmanProvider

__all__ = [
    "AbsentProvider",
    "ControlSocket",
    "HostProvider",
    "Instance",
    "PodmanProvider",
    "Provider",
    "Saved",
    "SpawnSpec",
    "VmProvider",
    "make_providers",
]


def make_providers(
    config: HostdConfig, cgroups: Cgroups, nursery: trio.Nursery, commit: Callable[[Instance], None]
) -> list[Provider]:
    """Every provider of this hostd; the first of each runtime kind is that kind's default."""
    providers: list[Provider] = [
        HostProvider(config, cgroups, nursery, commit),
        PodmanProvider(config, nursery, commit),
    ]
    if config.libvirt_uri:
        providers.append(VmProvider(config, nursery, commit))
    return providers
