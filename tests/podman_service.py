"""A real ``podman system service`` with one image, for the image-catalog tests (hostd and controller),
and podman storage holding a busybox image, for the container tests (where hostd starts the service).

Images cannot be pulled here, so the image is imported from a ``busybox-static`` rootfs. podman
runs with private storage under the test's directory (vfs, runc, cgroupfs), never touching the
host's images. :func:`podman_service` is started by the test; with :func:`busybox_storage` the
container tests let hostd start its own service on that storage (``AIWG_PODMAN_SERVICE``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tests.hostd_process import HostdProcess

BUSYBOX = Path("/bin/busybox")
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
IMAGE_REF = "localhost/aiwg-test-busybox:1"
IMAGE_LABEL = ("org.aiwg.test", "yes")
#: The container tests' image (and dev mode's): busybox with a link per applet, so ``sh`` exists.
BUSYBOX_IMAGE = "localhost/busybox:latest"


def podman_available() -> str | None:
    """None if the container tests can run here, else why not."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        return "podman or runc is not installed"
    if not BUSYBOX.exists():
        return "busybox-static is not installed (/bin/busybox)"
    return None


class PodmanStorage:
    """podman storage (graph root, run root, driver) that holds :data:`BUSYBOX_IMAGE`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "root"
        # podman refuses a runroot longer than 50 characters; pytest's tmp_path is longer.
        self.runroot = Path(tempfile.mkdtemp(prefix="aiwg-pd-", dir="/tmp"))

    def argv(self) -> list[str]:
        return _podman_argv(self.base, self.runroot)

    def hostd_env(self, socket_path: Path) -> dict[str, str]:
        """What a hostd needs to start its own podman service on this storage."""
        return {
            "AIWG_PODMAN_SOCKET": str(socket_path),
            "AIWG_PODMAN_SERVICE": "1",
            "AIWG_PODMAN_ROOT": str(self.root),
            "AIWG_PODMAN_RUNROOT": str(self.runroot),
            "AIWG_PODMAN_STORAGE_DRIVER": "vfs",
        }

    def remove(self) -> None:
        # Whatever a test left (it should leave nothing) goes with the storage.
        subprocess.run([*self.argv(), "rm", "-af", "-t", "0"], capture_output=True, timeout=60)
        # A service a SIGKILLed hostd left running (the next hostd uses it, as it should, but never
        # owns it) and the conmons of its last exec sessions would outlive the run otherwise.
        for proc in psutil.process_iter(["cmdline"]):
            if str(self.root) in (proc.info["cmdline"] or ()):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        shutil.rmtree(self.runroot, ignore_errors=True)


def start_hostd(state: Path, storage: PodmanStorage) -> HostdProcess:
    """A hostd (its own process) with state dir ``state`` that starts its own podman service on ``storage``."""
    return HostdProcess(state, env=storage.hostd_env(state.parent / "podman.sock")).start(timeout=40)


def busybox_storage(base: Path) -> PodmanStorage:
    """Fresh storage under ``base`` with :data:`BUSYBOX_IMAGE`, built by ``scripts/busybox_image.py``
    (what ``make run`` uses too) in about 0.3 s."""
    (base / "tmp").mkdir(parents=True)
    storage = PodmanStorage(base)
    env = {**os.environ, **storage.hostd_env(base / "unused.sock")}
    built = subprocess.run(
        [sys.executable, str(SCRIPTS / "busybox_image.py"), "--image", BUSYBOX_IMAGE],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr.decode(errors="replace")
    return storage


#: The image the container agent tests run Python agents in (``scripts/python_image.py``).
PYTHON_AGENT_IMAGE = "localhost/aiwg-python-agent:test"


def python_agent_image(storage: PodmanStorage, agents: Path) -> str:
    """:data:`PYTHON_AGENT_IMAGE` in ``storage`` (built once: about 100 MB, a few seconds), with
    ``agents`` at ``/opt/agents/<its name>``."""
    env = {**os.environ, **storage.hostd_env(storage.base / "unused.sock")}
    built = subprocess.run(
        [
            sys.executable, str(SCRIPTS / "python_image.py"), "--image", PYTHON_AGENT_IMAGE,
            "--file", f"{agents}:/opt/agents/{agents.name}",
        ],
        env=env,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr.decode(errors="replace")
    return PYTHON_AGENT_IMAGE


def _podman_argv(base: Path, runroot: Path) -> list[str]:
    return [
        "podman",
        "--root",
        str(base / "root"),
        "--runroot",
        str(runroot),
        "--storage-driver",
        "vfs",
        "--runtime",
        "runc",
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "file",
        "--tmpdir",
        str(base / "tmp"),
    ]


def _wait_for_socket(path: Path, proc: subprocess.Popen[bytes], deadline_s: float) -> None:
    """Poll until the service accepts connections (podman gives no readiness signal)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"podman system service exited with {proc.returncode}")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
                return
            except OSError:
                pass
        time.sleep(0.05)
    raise TimeoutError(f"podman socket {path} not ready after {deadline_s} s")


@contextmanager
def podman_service(base: Path) -> Iterator[Path]:
    """Yield the API socket of a podman service holding :data:`IMAGE_REF`; skip without podman."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.skip("podman or runc is not installed")
    if not BUSYBOX.exists():
        pytest.skip("busybox-static is not installed (/bin/busybox)")
    (base / "tmp").mkdir(parents=True)
    # podman refuses a runroot longer than 50 characters; pytest's tmp_path is longer.
    runroot = Path(tempfile.mkdtemp(prefix="aiwg-pd-", dir="/tmp"))
    argv = _podman_argv(base, runroot)
    tarball = base / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(BUSYBOX, arcname="bin/busybox")
    proc: subprocess.Popen[bytes] | None = None
    try:
        imported = subprocess.run(
            [*argv, "import", "--change", f"LABEL {IMAGE_LABEL[0]}={IMAGE_LABEL[1]}", str(tarball), IMAGE_REF],
            capture_output=True,
            timeout=60,
        )
        assert imported.returncode == 0, imported.stderr.decode(errors="replace")
        sock = base / "podman.sock"
        proc = subprocess.Popen(
            [*argv, "system", "service", "--time", "0", f"unix://{sock}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _wait_for_socket(sock, proc, 20)
        yield sock
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(runroot, ignore_errors=True)
