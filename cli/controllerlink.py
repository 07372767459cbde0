"""How ``agentic`` reaches the controller: its URL, the bearer token, and small HTTP helpers.

* URL: ``--url``, else ``AIWG_URL``, else ``http://127.0.0.1:8122`` (the dev listen address).
* Token: ``--token``, else ``AIWG_TOKEN``, else the file named by ``--token-file`` or
  ``AIWG_TOKEN_FILE``, else ``$AIWG_STATE_DIR/instances/dev.token`` (``./.run`` by default) that
  ``make run`` writes. An instance's own token works on its instance; an operator token on all.

HTTP is the standard library's (``urllib``): the client needs nothing beyond ``proto``'s
dependencies. Errors of the controller are shown by their message (A2A or problem body).
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8122"
TIMEOUT_S = 30.0


class ClientError(Exception):
    """Something the user should read (no traceback)."""


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help=f"controller base URL (AIWG_URL; default {DEFAULT_URL})")
    parser.add_argument("--token", help="bearer token (AIWG_TOKEN)")
    parser.add_argument("--token-file", help="file holding the bearer token (AIWG_TOKEN_FILE)")


def base_url(args: argparse.Namespace) -> str:
    return str(args.url or os.environ.get("AIWG_URL") or DEFAULT_URL).rstrip("/")


def token(args: argparse.Namespace) -> str:
    if args.token:
        return str(args.token)
    if os.environ.get("AIWG_TOKEN"):
        return os.environ["AIWG_TOKEN"]
    path = args.token_file or os.environ.get("AIWG_TOKEN_FILE")
    if path is None:
        path = str(Path(os.environ.get("AIWG_STATE_DIR") or ".run") / "instances" / "dev.token")
        if not os.path.exists(path):
            raise ClientError(
                "no token: give --token, AIWG_TOKEN or --token-file (make run writes .run/instances/dev.token)"
            )
    try:
        value = Path(path).read_text().strip()
    except OSError as exc:
        raise ClientError(f"cannot read the token file {path}: {exc.strerror}") from None
    if not value:
        raise ClientError(f"the token file {path} is empty")
    return value


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read() or b"{}")
    except ValueError:
        return f"HTTP {exc.code}"
    if isinstance(body.get("error"), dict):
        return f"{body['error'].get('status', exc.code)}: {body['error'].get('message', '')}"
    if "detail" in body or "title" in body:
        return f"{body.get('code', exc.code)}: {body.get('detail') or body.get('title')}"
    return f"HTTP {exc.code}"


class Controller:
    def __init__(self, args: argparse.Namespace, extra_headers: dict[str, str] | None = None) -> None:
        self.url = base_url(args)
        self.headers = {"Authorization": f"Bearer {token(args)}", **(extra_headers or {})}

    def _open(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        all_headers = {**self.headers, **(headers or {})}
        if data is not None:
            all_headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=all_headers)
        try:
            return urllib.request.urlopen(request, timeout=TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            raise ClientError(_error_message(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ClientError(f"cannot reach the controller at {self.url}: {reason}") from None

    def json(self, method: str, path: str, body: Any = None) -> Any:
        with self._open(method, path, body) as response:
            return json.loads(response.read())

    def sse(self, path: str, body: Any) -> Iterator[dict[str, Any]]:
        """The ``data:`` events of an SSE answer, parsed; ``event: error`` raises ClientError."""
        response = self._open("POST", path, body, {"Accept": "text/event-stream"})
        with response:
            event_name = None
            for raw in response:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line.startswith("event:"):
                    event_name = line[6:].strip()
                elif line.startswith("data:"):
                    payload = json.loads(line[5:].strip())
                    if event_name == "error":
                        error = payload.get("error", {})
                        raise ClientError(f"{error.get('status', 'error')}: {error.get('message', '')}")
                    yield payload
                elif not line:
                    event_name = None
