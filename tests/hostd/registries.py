"""What the registry tests share: a config rooted in one test's directory."""

from __future__ import annotations

from pathlib import Path

from hostd.config import HostdConfig


def make_config(tmp_path: Path, **overrides: object) -> HostdConfig:
    """A hostd config rooted in ``tmp_path``: no cgroups unless asked, a short stop grace."""
    settings: dict = {
        "state_dir": str(tmp_path / "state"),
        "socket_path": str(tmp_path / "hostd.sock"),
        "stop_grace_s": 2.0,
        "max_sessions": 16,
        "cgroup_root": "off",
    }
    settings.update(overrides)
    return HostdConfig(**settings)
