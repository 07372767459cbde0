"""How ``agentic`` reaches the controller: where it is, which token, and the HTTP calls it makes.

* URL: ``--url``, else ``AIWG_CONTROLLER_URL``, else ``http://127.0.0.1:8122`` (the dev listen address).
* Token: ``--token``, else ``AIWG_TOKEN``, else the file ``--token-file`` / ``AIWG_TOKEN_FILE``, else
  what ``make run`` leaves in the dev state dir (``$AIWG_STATE_DIR``, default ``./.run``): the admin
  token ``admin-token``, or the dev instance's A2A token ``instances/dev.token``. An instance's own
  token works on its instance (A2A); the admin API and PTY sessions need an operator token.

* TLS: ``https://`` URLs are verified against the system's CAs, or ``--cacert`` / ``AIWG_CA_FILE``;
  ``--cert`` and ``--key`` (``AIWG_CLIENT_CERT``, ``AIWG_CLIENT_KEY``) present a client certificate
  (mTLS). A controller that takes the certificate as the caller needs no token beside it.

HTTP is the standard library's (``urllib``: the client needs nothing beyond ``proto``'s
dependencies). Calls block; async commands run them in a worker thread (:meth:`Api.call`): a
handful per command, nothing here is a hot path. Every failure is :class:`ApiError`, with the
controller's code and message when the body is a problem+json or an A2A error.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

DEFAULT_URL = "http://127.0.0.1:8122"
TIMEOUT_S = 30.0
_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


class ApiError(Exception):
    """Something the user should read (no traceback). ``status`` 0: the controller was not reached
    (or no call was made)."""

    def __init__(self, status: int, code: str, message: str, body: Any = None) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.status = status
        self.code = code
        #: The error body as sent (its details: field violations, validation errors).
        self.body = body


def _http_error(exc: urllib.error.HTTPError) -> ApiError:
    try:
        body = json.loads(exc.read() or b"{}")
    except ValueError:
        return ApiError(exc.code, "", f"HTTP {exc.code} {exc.reason}")
    if isinstance(body, dict) and isinstance(body.get("error"), dict):  # A2A
        error = body["error"]
        return ApiError(exc.code, str(error.get("status", "")), str(error.get("message", "")), body)
    if isinstance(body, dict) and ("code" in body or "detail" in body):  # problem+json
        return ApiError(exc.code, str(body.get("code", "")), str(body.get("detail") or body.get("title", "")))
    return ApiError(exc.code, "", f"HTTP {exc.code} {exc.reason}")


@dataclass(frozen=True)
class Api:
    url: str
    token: str
    #: Sent with every request besides the bearer token (A2A: ``A2A-Version``, ``A2A-Extensions``).
    headers: Mapping[str, str] = field(default_factory=dict)
    #: How ``https``/``wss`` are verified, and the client certificate shown (None: the defaults).
    tls: ssl.SSLContext | None = field(default=None, compare=False)

    @property
    def auth_headers(self) -> dict[str, str]:
        """The bearer token, if there is one (a client certificate may stand in for it)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def __repr__(self) -> str:
        return f"Api(url={self.url!r}, token='***')"

    def with_headers(self, headers: Mapping[str, str]) -> Api:
        return replace(self, headers={**self.headers, **headers})

    @property
    def ws_base(self) -> str:
        return "ws" + self.url[4:] if self.url.startswith("http") else self.url

    def _open(self, method: str, path: str, body: Any = None, headers: Mapping[str, str] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        for name, value in {**self.headers, **(headers or {})}.items():
            request.add_header(name, value)
        for name, value in self.auth_headers.items():
            request.add_header(name, value)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            return urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self.tls)
        except urllib.error.HTTPError as exc:
            raise _http_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ApiError(0, "", f"cannot reach the controller at {self.url}: {reason}") from None

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One call; the JSON answer (None for an empty one)."""
        return self.exchange(method, path, body)[1]

    def exchange(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One call; its status and JSON answer (None for an empty one)."""
        with self._open(method, path, body) as response:
            raw = response.read()
            status = int(response.status)
        return status, (json.loads(raw) if raw else None)

    def sse(self, path: str, body: Any) -> Iterator[dict[str, Any]]:
        """The ``data:`` events of a POST answered with SSE, parsed; ``event: error`` raises ApiError."""
        with self._open("POST", path, body, {"Accept": "text/event-stream"}) as response:
            event_name = None
            for raw in response:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line.startswith("event:"):
                    event_name = line[6:].strip()
                elif line.startswith("data:"):
                    payload = json.loads(line[5:].strip())
                    if event_name == "error":
                        error = payload.get("error", {})
                        raise ApiError(0, str(error.get("status", "error")), str(error.get("message", "")))
                    yield payload
                elif not line:
                    event_name = None

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        return await trio.to_thread.run_sync(self.request, method, path, body)

    def find_instance(self, name_or_id: str) -> str:
        """An instance id, given its id or its name (a name is looked up with the admin API)."""
        if _UUID_RE.match(name_or_id):
            return name_or_id
        for item in self.request("GET", "/api/v2/admin/instances")["items"]:
            if item["name"] == name_or_id:
                return str(item["id"])
        raise ApiError(404, "instance.not_found", f"no instance named {name_or_id!r}")

    async def instance_id(self, name_or_id: str) -> str:
        return await trio.to_thread.run_sync(self.find_instance, name_or_id)

    def sessions_path(self, instance_id: str) -> str:
        return f"/api/v2/admin/instances/{urllib.parse.quote(instance_id, safe='')}/sessions"


def _dev_token_file(environ: Mapping[str, str]) -> str | None:
    state = Path(environ.get("AIWG_STATE_DIR") or ".run")
    for candidate in (state / "admin-token", state / "instances" / "dev.token"):
        if candidate.exists():
            return str(candidate)
    return None


def tls_context(cacert: str | None, cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The TLS context of ``--cacert``/``--cert``/``--key``; None when none is given."""
    if not (cacert or cert or key):
        return None
    if bool(cert) != bool(key):
        raise ApiError(0, "", "a client certificate needs both --cert and --key (AIWG_CLIENT_CERT, AIWG_CLIENT_KEY)")
    try:
        context = ssl.create_default_context(cafile=cacert)
        if cert and key:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ApiError(0, "", f"TLS files: {exc}") from None
    return context


def resolve(
    url: str | None,
    token: str | None,
    token_file: str | None,
    env: Mapping[str, str] | None = None,
    *,
    cacert: str | None = None,
    cert: str | None = None,
    key: str | None = None,
) -> Api:
    environ = os.environ if env is None else env
    base = (url or environ.get("AIWG_CONTROLLER_URL") or DEFAULT_URL).rstrip("/")
    cert = cert or environ.get("AIWG_CLIENT_CERT")
    tls = tls_context(cacert or environ.get("AIWG_CA_FILE"), cert, key or environ.get("AIWG_CLIENT_KEY"))
    secret = token or environ.get("AIWG_TOKEN")
    if not secret:
        path = token_file or environ.get("AIWG_TOKEN_FILE") or _dev_token_file(environ)
        if path is None and cert:
            return Api(base, "", tls=tls)  # the certificate is the credential
        if path is None:
            raise ApiError(0, "", "no token: pass --token or --token-file, or set AIWG_TOKEN or AIWG_TOKEN_FILE")
        try:
            secret = Path(path).read_text().strip()
        except OSError as exc:
            raise ApiError(0, "", f"token file {path}: {exc.strerror}") from None
        if not secret:
            raise ApiError(0, "", f"token file {path} is empty")
    return Api(base, secret, tls=tls)
