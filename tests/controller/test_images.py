"""ImageService against a real podman API socket (started by the test, never by the controller)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from controller.config import load_config
from controller.images import ImageService, image_from_attrs, socket_url
from tests.controller.conftest import ROOT, LiveHostd, controller_env, serve_controller

BUSYBOX = Path("/bin/busybox")
IMAGE_REF = "localhost/aiwg-test-busybox:1"


def _podman_argv(base: Path, runroot: Path) -> list[str]:
    """podman with private storage under ``base`` so the test never touches the host's images."""
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


@pytest.fixture
def podman_socket(tmp_path: Path) -> Iterator[Path]:
    """A podman API service with one image imported from a busybox-static rootfs."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.skip("podman or runc is not installed")
    if not BUSYBOX.exists():
        pytest.skip("busybox-static is not installed (/bin/busybox)")
    base = tmp_path / "podman"
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
            [*argv, "import", "--change", "LABEL org.aiwg.test=yes", str(tarball), IMAGE_REF],
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


@pytest.mark.podman
async def test_lists_imported_image(podman_socket: Path) -> None:
    result = await ImageService(str(podman_socket)).list_images()
    assert not result.degraded and result.reason is None
    (image,) = [i for i in result.items if i.reference == IMAGE_REF]
    assert image.name == "aiwg-test-busybox"
    assert image.digest is not None and image.digest.startswith("sha256:")
    assert image.size_bytes is not None and image.size_bytes > 100_000
    assert image.labels.get("org.aiwg.test") == "yes"


async def test_degraded_when_socket_missing(tmp_path: Path) -> None:
    result = await ImageService(str(tmp_path / "absent.sock")).list_images()
    assert result.items == [] and result.degraded
    assert result.reason is not None and "does not exist" in result.reason


async def test_degraded_when_not_configured() -> None:
    result = await ImageService(None).list_images()
    assert result.items == [] and result.degraded and result.reason == "no podman socket configured"


async def test_degraded_when_podman_hangs(tmp_path: Path) -> None:
    """A socket that accepts but never answers costs at most the timeout, then degrades."""
    path = tmp_path / "hung.sock"
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    with listener:
        await listener.bind(str(path))
        listener.listen(8)
        start = trio.current_time()
        result = await ImageService(str(path), timeout_s=0.5).list_images()
        elapsed = trio.current_time() - start
    assert result.degraded and result.items == []
    assert elapsed < 3


def test_socket_url_and_mapping() -> None:
    assert socket_url("/run/p.sock") == "unix:///run/p.sock"
    assert socket_url("unix:///run/p.sock") == "unix:///run/p.sock"
    for bad in ("ssh://root@host/run/p.sock", "relative.sock", "tcp://127.0.0.1:1"):
        with pytest.raises(ValueError):
            socket_url(bad)
    untagged = image_from_attrs({"Id": "ab" * 32, "RepoTags": None, "Size": 10, "Labels": None})
    assert untagged.name == "ab" * 6 and untagged.reference == "ab" * 32 and untagged.digest == "sha256:" + "ab" * 32
    tagged = image_from_attrs(
        {"Id": "cd" * 32, "RepoTags": ["registry:5000/team/tool:2.0"], "Digest": "sha256:ee", "Labels": {"a": "b"}}
    )
    assert (tagged.name, tagged.reference, tagged.digest) == ("tool", "registry:5000/team/tool:2.0", "sha256:ee")
    assert tagged.labels == {"a": "b"} and tagged.size_bytes is None


# -- the admin route over real HTTP ----------------------------------------------------------------


@pytest.mark.podman
async def test_route_lists_podman_images(podman_socket: Path, hostd: LiveHostd, tmp_path: Path) -> None:
    env = controller_env(tmp_path / "controller", hostd.socket_path, AIWG_PODMAN_SOCKET=str(podman_socket))
    async with serve_controller(load_config(env=env)) as live, live.client() as admin:
        for path in ("/api/v2/admin/container-images", "/api/v1/container-images"):
            r = await admin.get(path)
            assert r.status_code == 200, r.text
            body = r.json()
            assert "degraded" not in body
            assert [i["reference"] for i in body["items"]] == [IMAGE_REF]
        async with live.client(None) as anon:
            assert (await anon.get("/api/v2/admin/container-images")).status_code == 401


async def test_route_degraded_without_podman(admin: httpx.AsyncClient) -> None:
    r = await admin.get("/api/v2/admin/container-images")
    assert r.status_code == 200
    assert r.json() == {"items": [], "degraded": True, "reason": "no podman socket configured"}


GUARDED_LISTING = """
import sys, trio
from controller.images import ImageService
from controller.guard import install_process_guard
install_process_guard()  # as controller.main does before serving
result = trio.run(ImageService(sys.argv[1]).list_images)
assert not result.degraded, result.reason
print(len(result.items))
"""


@pytest.mark.podman
async def test_listing_spawns_nothing_under_the_process_guard(podman_socket: Path) -> None:
    """podman-py (imported lazily, after the guard) lists images without creating a process."""
    result = await trio.run_process(
        [sys.executable, "-c", GUARDED_LISTING, str(podman_socket)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert result.stdout.strip() == b"1"
