"""Fixtures of the hostd tests."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostd_process import HostdProcess
from tests.podman_service import PodmanStorage, start_hostd
from tests.processes import procs_where


@pytest.fixture
def leak_check(tmp_path: Path) -> Iterator[None]:
    """Fail the test if any process started for it (found by its instance dir) or an fd is left."""
    fds = set(os.listdir("/proc/self/fd"))
    yield
    gc.collect()
    leaked_fds = {
        fd: os.readlink(f"/proc/self/fd/{fd}")
        for fd in set(os.listdir("/proc/self/fd")) - fds
        if os.path.exists(f"/proc/self/fd/{fd}")
    }
    prefix = str(tmp_path)
    left = procs_where("AIWG_INSTANCE_DIR", lambda v: v.startswith(prefix))
    for proc in left:
        proc.kill()
    assert not left, f"processes left behind: {[p.pid for p in left]}"
    assert not leaked_fds, f"fds left open: {leaked_fds}"


@pytest.fixture
def container_hostd(tmp_path: Path, podman_storage: PodmanStorage) -> Iterator[HostdProcess]:
    """A hostd with its own podman service on the run's busybox storage (the container tests)."""
    proc = start_hostd(tmp_path / "state", podman_storage)
    try:
        yield proc
    finally:
        proc.cleanup()
