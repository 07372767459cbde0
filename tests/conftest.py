from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

# The gRPC tests leave gRPC's event engine threads in this process, and the hostd tests fork here
# (PTY sessions run in-process). With gRPC's fork support on, its handlers run in each forked child
# and can kill it before it execs ("Epoll1Poller ... epoll_wait error: Bad file descriptor" as the
# session's only output). The child execs at once and needs no gRPC: no handlers. (Production
# never meets this: hostd imports no gRPC, the controller forks nothing.)
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from tests.hostd_process import HostdProcess
from tests.libvirt_service import guest_image, libvirt_system  # noqa: F401 - fixtures of the VM tests
from tests.podman_service import PodmanStorage, busybox_storage, podman_available
from tests.postgres_service import PgCluster, pgcluster
from tests.processes import alive

_OWN_BASETEMP = pytest.StashKey[str]()
_FAILED = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    """Give this run a temp root of its own unless one was asked for.

    pytest's default root keeps the last three numbered dirs and deletes older ones when a run
    starts: two suites running at once on one machine (two checkouts, a developer's run beside CI)
    would delete each other's hostd state dirs and sockets mid-test.
    """
    if config.option.basetemp is None:
        config.option.basetemp = tempfile.mkdtemp(prefix="aiwg-tests-")
        config.stash[_OWN_BASETEMP] = config.option.basetemp


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_FAILED] = exitstatus != 0


def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.stash.get(_OWN_BASETEMP, None)
    if own is None:
        return
    if config.stash.get(_FAILED, False):
        print(f"temp files of this run kept in {own}")  # the failed tests' state dirs and logs
    else:
        shutil.rmtree(own, ignore_errors=True)


@pytest.fixture
def hostd(tmp_path: Path) -> Iterator[HostdProcess]:
    """A running hostd (dev mode) with its own state dir; stopped and checked afterwards.

    Every process hostd started for PTY sessions and execs must be gone once hostd stopped.
    Instance main processes are left running by design (re-adopted by the next hostd), so a
    test that starts them destroys its instances before it ends.
    """
    proc = HostdProcess(tmp_path / "state").start()
    try:
        yield proc
    finally:
        descendants: set[int] = set()
        try:
            descendants = {p.pid for p in psutil.Process(proc.proc.pid).children(recursive=True)}
        except psutil.Error:
            pass
        proc.stop()
        left = alive(descendants)
        for pid in left:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        proc.cleanup()
        assert not left, f"processes left behind by hostd: {left}"


@pytest.fixture(scope="session")
def podman_storage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodmanStorage]:
    """podman storage holding the busybox image, built once per run; each container test's hostd
    starts its own podman service on it (skipped where podman cannot run)."""
    missing = podman_available()
    if missing is not None:
        pytest.skip(missing)
    storage = busybox_storage(tmp_path_factory.mktemp("podman"))
    try:
        yield storage
    finally:
        storage.remove()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """A private PostgreSQL server for this run (started on first use, removed at the end)."""
    missing = pgcluster.missing()
    if missing is not None:
        pytest.fail(f"PostgreSQL is needed by the suite: {missing} (make test installs it)")
    cluster = PgCluster().start()
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    """A fresh, empty database on the run's server: its URL."""
    return str(pg_cluster.create_database())
