"""Rules every route keeps: OPTIONS under /api/ answers as the API would; no body, no Content-Type.

Served for real (hypercorn on loopback, httpx); no hostd is needed for these answers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from agentic_sandbox.controller.config import load_config
from agentic_sandbox.proto.ids import new_id

from ..conftest import ADMIN_TOKEN, OPERATOR_TOKEN, LiveController, controller_env, serve_controller
from .test_problems import assert_problem

API_ROUTES = {
    "/api/v2/admin/instances": {"GET", "POST"},
    "/api/v2/admin/storage/inbox/x/y.txt": {"GET", "PUT", "DELETE"},
    "/api/v2/admin/operations/op_1": {"GET"},
    "/api/v1/agents": {"GET", "POST"},
    "/api/v1/storage/outbox/x/y.txt": {"GET", "PUT", "DELETE"},
}


@pytest.fixture
async def live(short_dir: Path) -> AsyncIterator[LiveController]:
    env = controller_env(short_dir / "controller", str(short_dir / "no-hostd.sock"))
    async with serve_controller(load_config(env=env), wait_ready=False) as controller:
        yield controller


@pytest.mark.parametrize("path", sorted(API_ROUTES))
async def test_options_needs_a_token(live: LiveController, path: str) -> None:
    for token in (None, "wrong-token-" + "w" * 20):
        async with live.client(token) as client:
            response = await client.options(path)
        assert_problem(response, 401, "auth.unauthorized")
        assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("path", sorted(API_ROUTES))
async def test_options_with_a_token_lists_the_methods(live: LiveController, path: str) -> None:
    for token in (ADMIN_TOKEN, OPERATOR_TOKEN):
        async with live.client(token) as client:
            response = await client.options(path)
        assert response.status_code == 204, response.text
        assert response.content == b"" and "content-type" not in response.headers
        allowed = {method.strip() for method in response.headers["allow"].split(",")}
        assert allowed == API_ROUTES[path] | {"HEAD", "OPTIONS"}


async def test_options_on_an_unknown_api_path_is_a_404_problem(live: LiveController) -> None:
    async with live.client(ADMIN_TOKEN) as client:
        assert_problem(await client.options("/api/v2/admin/nothing-here"), 404, "route.not_found")


async def test_responses_without_a_body_carry_no_content_type(live: LiveController) -> None:
    box = Path(live.config.storage_dir) / "outbox" / (iid := new_id())
    box.mkdir(parents=True)
    (box / "gone.txt").write_bytes(b"x")
    async with live.client(ADMIN_TOKEN) as client:
        response = await client.delete(f"/api/v2/admin/storage/outbox/{iid}/gone.txt")
        assert response.status_code == 204 and response.content == b""
        assert "content-type" not in response.headers, response.headers
        # Outside /api/ the automatic OPTIONS answer stays, without a made-up type.
        response = await client.options("/healthz")
        assert response.content == b"" and "content-type" not in response.headers, response.headers
        # A body keeps its type, HEAD included (it describes the GET's body).
        head = await client.head("/healthz")
        assert head.status_code == 200 and head.headers["content-type"] == "application/json"


async def test_anonymous_requests_still_reach_the_open_routes(live: LiveController) -> None:
    async with httpx.AsyncClient(base_url=live.url) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.options("/metrics")).status_code in (200, 204)
