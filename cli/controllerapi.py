"""The controller's HTTP API as the ``agentic`` commands use it: where it is, which token, a few calls.

The controller is ``--url``, else ``AIWG_CONTROLLER_URL``, else ``http://127.0.0.1:8122`` (the dev
default). The token is ``--token``, else ``AIWG_TOKEN``, else the file ``--token-file`` /
``AIWG_TOKEN_FILE``, else the dev admin token file ``./.run/admin-token`` when it exists. Calls are
plain ``urllib`` requests run in a worker thread (a handful per command; nothing here is a hot
path); a failure is :class:`ApiError` with the problem's code and detail when the body is one.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import trio

DEFAULT_URL = "http://127.0.0.1:8122"
DEV_TOKEN_FILE = os.path.join(".run", "admin-token")
TIMEOUT_S = 15.0
_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.status = status
        self.code = code


@dataclass(frozen=True)
class Api:
    url: str
    token: str

    def __repr__(self) -> str:
        return f"Api(url={self.url!r}, token='***')"

    @property
    def ws_base(self) -> str:
        return "ws" + self.url[4:] if self.url.startswith("http") else self.url

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                problem = json.loads(raw)
                raise ApiError(exc.code, str(problem.get("code", "")), str(problem.get("detail", exc.reason))) from None
            except (ValueError, AttributeError):
                raise ApiError(exc.code, "", f"HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ApiError(0, "", f"cannot reach the controller at {self.url}: {reason}") from None
        return json.loads(raw) if raw else None

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        return await trio.to_thread.run_sync(self._request, method, path, body)

    async def instance_id(self, name_or_id: str) -> str:
        """An instance id, given its id or its name."""
        if _UUID_RE.match(name_or_id):
            return name_or_id
        items = (await self.call("GET", "/api/v2/admin/instances"))["items"]
        for item in items:
            if item["name"] == name_or_id:
                return str(item["id"])
        raise ApiError(404, "instance.not_found", f"no instance named {name_or_id!r}")

    def sessions_path(self, instance_id: str) -> str:
        return f"/api/v2/admin/instances/{urllib.parse.quote(instance_id, safe='')}/sessions"


def resolve(url: str | None, token: str | None, token_file: str | None, env: dict[str, str] | None = None) -> Api:
    environ = os.environ if env is None else env
    base = (url or environ.get("AIWG_CONTROLLER_URL") or DEFAULT_URL).rstrip("/")
    secret = token or environ.get("AIWG_TOKEN")
    if not secret:
        dev_file = DEV_TOKEN_FILE if os.path.exists(DEV_TOKEN_FILE) else None
        path = token_file or environ.get("AIWG_TOKEN_FILE") or dev_file
        if path is None:
            raise ApiError(0, "", "no token: pass --token, set AIWG_TOKEN or AIWG_TOKEN_FILE")
        try:
            with open(path) as fh:
                secret = fh.read().strip()
        except OSError as exc:
            raise ApiError(0, "", f"token file {path}: {exc.strerror}") from None
    return Api(base, secret)
