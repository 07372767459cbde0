"""``/container-images`` through hostd: a real podman socket handed to the real hostd, degraded
without podman, and fail-closed (503) without hostd."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from agentic_sandbox.controller.config import load_config
from tests.podman_service import IMAGE_REF, podman_service

from ..conftest import LiveHostd, controller_env, serve_controller
from ..http.test_problems import assert_problem

PATHS = ("/api/v2/admin/container-images", "/api/v1/container-images")


@pytest.fixture
async def podman_hostd(tmp_path: Path, short_dir: Path) -> AsyncIterator[LiveHostd]:
    """A hostd whose ``AIWG_PODMAN_SOCKET`` is a real podman service holding one image."""
    with podman_service(tmp_path / "podman") as sock:
        live = LiveHostd(short_dir, env={"AIWG_PODMAN_SOCKET": str(sock)})
        await live.start()
        try:
            yield live
        finally:
            await live.close()


@pytest.mark.podman
async def test_route_lists_podman_images(podman_hostd: LiveHostd, tmp_path: Path) -> None:
    env = controller_env(tmp_path / "controller", podman_hostd.socket_path)
    async with serve_controller(load_config(env=env)) as live, live.client() as admin:
        for path in PATHS:
            r = await admin.get(path)
            assert r.status_code == 200, r.text
            body = r.json()
            assert "degraded" not in body
            assert [i["reference"] for i in body["items"]] == [IMAGE_REF]
            (image,) = body["items"]
            assert image["name"] == "aiwg-test-busybox" and image["digest"].startswith("sha256:")
        async with live.client(None) as anon:
            assert (await anon.get("/api/v2/admin/container-images")).status_code == 401


async def test_route_degraded_without_podman(admin: httpx.AsyncClient) -> None:
    r = await admin.get("/api/v2/admin/container-images")
    assert r.status_code == 200
    assert r.json() == {"items": [], "degraded": True, "reason": "no podman socket configured"}


async def test_route_fails_closed_without_hostd(short_dir: Path, tmp_path: Path) -> None:
    """podman away is an answer (degraded); hostd away is not: 503 like every hostd-backed route."""
    env = controller_env(tmp_path / "controller", str(short_dir / "absent.sock"))
    async with serve_controller(load_config(env=env), wait_ready=False) as live, live.client() as admin:
        for path in PATHS:
            r = await admin.get(path)
            problem = assert_problem(r, 503, "internal.unavailable")
            assert "hostd" in problem["detail"]
            assert r.headers["Retry-After"] == "1"
