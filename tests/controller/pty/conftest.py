"""Fixtures for the PTY attach tests: a running host instance and a way to start sessions in it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ..conftest import LiveController, provision
from .wsclient import WS, attach_url


@dataclass
class Instance:
    controller: LiveController
    admin: httpx.AsyncClient
    id: str

    async def session(self, argv: list[str] | None = None, **body: Any) -> str:
        payload = {"argv": argv or ["/bin/cat"], **body}
        response = await self.admin.post(f"/api/v2/admin/instances/{self.id}/sessions", json=payload)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def url(self, sid: str, query: str = "") -> str:
        return attach_url(self.controller.url, self.id, sid, query)

    async def attach(self, sid: str, query: str = "", **kwargs: Any) -> WS:
        ws = await WS.connect(self.url(sid, query), **kwargs)
        hello = await ws.json()
        assert hello["op"] == "binding_hello" and hello["sequence"] == 0, hello
        return ws


@pytest.fixture
async def instance(controller: LiveController, admin: httpx.AsyncClient) -> AsyncIterator[Instance]:
    op = await provision(admin, "pty-host", start=True)
    yield Instance(controller, admin, str(op["result"]["instance_id"]))
