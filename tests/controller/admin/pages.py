"""What the admin list tests share: reading a paged list to its end."""

from __future__ import annotations

from typing import Any

import httpx


async def all_pages(client: httpx.AsyncClient, path: str, **params: Any) -> list[dict[str, Any]]:
    """Every page of a list in turn (``limit`` in ``params``), each ``next_page_token`` handed to
    the next request; each page but the last is full."""
    items: list[dict[str, Any]] = []
    token = None
    while True:
        response = await client.get(path, params={**params, **({"page_token": token} if token else {})})
        assert response.status_code == 200, response.text
        body = response.json()
        items += body["items"]
        token = body["next_page_token"]
        if not token:
            return items
        assert len(body["items"]) == int(params["limit"])
