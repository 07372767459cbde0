"""What the registry tests share: a config rooted in one test's directory, a registry built like hostd's."""

from __future__ import annotations

from pathlib import Path

import trio

from hostd.config import HostdConfig
from hostd.instances import InstanceRegistry
from hostd.proctree import Cgroups
from hostd.providers import make_providers


def make_config(tmp_path: Path, **overrides: object) -> HostdConfig:
    """A hostd config rooted in ``tmp_path``: no cgroups unless asked, a short stop grace."""
    settings: dict = {
        "state_dir": str(tmp_path / "state"),
        "socket_path": str(tmp_path / "hostd.sock"),
        "stop_grace_s": 2.0,
        "max_sessions": 16,
        "cgroup_root": "off",
        "libvirt_uri": "",  # no VM runtime unless a test asks for one
    }
    settings.update(overrides)
    return HostdConfig(**settings)


def open_registry(config: HostdConfig, cgroups: Cgroups, nursery: trio.Nursery) -> InstanceRegistry:
    """An instance registry with this hostd's real providers, as ``hostd.main`` builds it."""
    registry = InstanceRegistry(config)
    registry.use_providers(make_providers(config, cgroups, nursery, registry.commit))
    return registry
