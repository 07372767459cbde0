"""A controller that may push to loopback receivers (AIWG_PUSH_ALLOW_PRIVATE=1), with short
retry timings so the retry and give-up paths run in a test's time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from agentic_sandbox.controller.config import load_config
from tests.controller.conftest import ADMIN_TOKEN, LiveController, LiveHostd, controller_env, serve_controller

PUSH_ENV = {
    "AIWG_PUSH_ALLOW_PRIVATE": "1",
    "AIWG_PUSH_TIMEOUT_S": "0.5",
    "AIWG_PUSH_BACKOFF_S": "0.05",
    "AIWG_PUSH_RETRY_S": "3",
}


@pytest.fixture
async def push_controller(hostd: LiveHostd, tmp_path: Path) -> AsyncIterator[LiveController]:
    config = load_config(env=controller_env(tmp_path / "controller", hostd.socket_path, **PUSH_ENV))
    async with serve_controller(config) as live:
        yield live


@pytest.fixture
async def push_admin(push_controller: LiveController) -> AsyncIterator[httpx.AsyncClient]:
    async with push_controller.client(ADMIN_TOKEN) as client:
        yield client
