"""hostd's image catalog: the libpod mapping, degraded answers, a real podman socket, and the RPC."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from agentic_sandbox.hostd.providers.podman.images import ImageCatalog, image_from_attrs
from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd
from tests.hostd_process import ROOT, HostdProcess
from tests.podman_service import IMAGE_LABEL, IMAGE_REF, podman_service


@pytest.fixture
def podman_socket(tmp_path: Path) -> Iterator[Path]:
    with podman_service(tmp_path / "podman") as sock:
        yield sock


def test_libpod_entries_map_onto_image_info() -> None:
    untagged = image_from_attrs({"Id": "ab" * 32, "RepoTags": None, "Size": 10, "Labels": None})
    assert untagged.name == "ab" * 6 and untagged.reference == "ab" * 32 and untagged.digest == "sha256:" + "ab" * 32
    assert untagged.size_bytes == 10 and untagged.labels == {}
    tagged = image_from_attrs(
        {"Id": "cd" * 32, "RepoTags": ["registry:5000/team/tool:2.0"], "Digest": "sha256:ee", "Labels": {"a": "b"}}
    )
    assert (tagged.name, tagged.reference, tagged.digest) == ("tool", "registry:5000/team/tool:2.0", "sha256:ee")
    assert tagged.labels == {"a": "b"} and tagged.size_bytes is None
    assert image_from_attrs({"Id": "ef" * 32, "RepoTags": ["<none>:<none>"], "Size": -1}).size_bytes is None


async def test_degraded_when_not_configured() -> None:
    result = await ImageCatalog("").list()
    assert result.images == [] and result.degraded and result.reason == "no podman socket configured"


async def test_degraded_when_socket_missing(tmp_path: Path) -> None:
    result = await ImageCatalog(f"unix://{tmp_path / 'absent.sock'}").list()
    assert result.images == [] and result.degraded
    assert result.reason is not None and "does not exist" in result.reason


async def test_degraded_when_podman_hangs(tmp_path: Path) -> None:
    """A socket that accepts but never answers costs at most the timeout, then degrades; the event
    loop keeps running meanwhile (the listing waits in a worker thread)."""
    path = tmp_path / "hung.sock"
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.05)

    with listener:
        await listener.bind(str(path))
        listener.listen(8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            start = trio.current_time()
            result = await ImageCatalog(f"unix://{path}", timeout_s=0.5).list()
            elapsed = trio.current_time() - start
            nursery.cancel_scope.cancel()
    assert result.degraded and result.images == [] and result.reason
    assert elapsed < 3
    assert ticks >= 5  # the loop was never blocked while podman hung


@pytest.mark.podman
async def test_lists_imported_image(podman_socket: Path) -> None:
    result = await ImageCatalog(f"unix://{podman_socket}").list()
    assert not result.degraded and result.reason is None
    (image,) = [i for i in result.images if i.reference == IMAGE_REF]
    assert image.name == "aiwg-test-busybox"
    assert image.digest is not None and image.digest.startswith("sha256:")
    assert image.size_bytes is not None and image.size_bytes > 100_000
    assert image.labels.get(IMAGE_LABEL[0]) == IMAGE_LABEL[1]


GUARDED_LISTING = """
import sys, trio
from agentic_sandbox.controller.guard import install_process_guard
from agentic_sandbox.hostd.providers.podman.images import ImageCatalog
install_process_guard()  # an audit hook refusing every process creation from here on
result = trio.run(ImageCatalog(sys.argv[1]).list)
assert not result.degraded, result.reason
print(len(result.images))
"""


@pytest.mark.podman
async def test_listing_spawns_nothing(podman_socket: Path) -> None:
    """podman-py over the Unix socket lists images without creating a process (hostd.providers.podman.images is not
    one of hostd's fenced spawning modules)."""
    result = await trio.run_process(
        [sys.executable, "-c", GUARDED_LISTING, f"unix://{podman_socket}"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert result.stdout.strip() == b"1"


# -- over hostd's RPC ------------------------------------------------------------------------------


async def test_rpc_answers_degraded_without_podman(hostd: HostdProcess) -> None:
    async with open_hostd(str(hostd.socket_path), client_name="test") as client:
        reply = await client.call(m.ImageListRequest())
        assert isinstance(reply, m.ImageListResponse)
        assert (reply.images, reply.degraded, reply.reason) == ([], True, "no podman socket configured")
        assert isinstance(await client.call(m.PingRequest()), m.PingResponse)  # the connection goes on


@pytest.mark.podman
async def test_rpc_lists_the_configured_podman(podman_socket: Path, tmp_path: Path) -> None:
    proc = HostdProcess(tmp_path / "state", env={"AIWG_PODMAN_SOCKET": str(podman_socket)}).start()
    try:
        async with open_hostd(str(proc.socket_path), client_name="test") as client:
            reply = await client.call(m.ImageListRequest())
        assert not reply.degraded
        assert [i.reference for i in reply.images] == [IMAGE_REF]
    finally:
        proc.cleanup()
