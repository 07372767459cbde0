"""What the registry tests share: a config rooted in one test's directory, a registry built like hostd's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from agentic_sandbox.hostd.config import HostdConfig
from agentic_sandbox.hostd.instances import InstanceRegistry
from agentic_sandbox.hostd.proctree import Cgroups
from agentic_sandbox.hostd.providers import make_providers


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
    nursery.start_soon(registry.sleep.run)  # the idle watch and the wakes, as hostd.main starts them
    return registry


def real_cgroups() -> Cgroups:
    """hostd's cgroup v2 subtree as it would find it; skips the test without root or one."""
    if os.geteuid() != 0:
        pytest.skip("needs root for cgroups")
    cgroups = Cgroups.detect("")
    if not cgroups.available:
        pytest.skip("no writable cgroup v2 hierarchy")
    return cgroups
