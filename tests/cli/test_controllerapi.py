"""How ``agentic`` reaches the controller: where and with which token (in memory, with the
environment passed in), then the HTTP calls against a real HTTP server on loopback (the standard
library's, in a thread) that answers what each case needs: JSON, SSE, and every kind of error body."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agentic_sandbox.cli.controllerapi import DEFAULT_URL, Api, ApiError, resolve

# -- where and which token -------------------------------------------------------------------------


def test_flags_then_environment_then_defaults(tmp_path: Path) -> None:
    env = {"AIWG_CONTROLLER_URL": "http://env:1/", "AIWG_TOKEN": "env-token", "AIWG_STATE_DIR": str(tmp_path)}
    assert resolve("http://flag:2/", "flag-token", None, env) == Api("http://flag:2", "flag-token")
    assert resolve(None, None, None, env) == Api("http://env:1", "env-token")
    assert resolve(None, "t", None, {}).url == DEFAULT_URL


def test_token_files_and_the_dev_state_dir(tmp_path: Path) -> None:
    flag_file, env_file = tmp_path / "flag.token", tmp_path / "env.token"
    flag_file.write_text("from-flag\n")
    env_file.write_text("  from-env  \n")
    env = {"AIWG_TOKEN_FILE": str(env_file), "AIWG_STATE_DIR": str(tmp_path / "state")}
    assert resolve(None, None, str(flag_file), env).token == "from-flag"
    assert resolve(None, None, None, env).token == "from-env"
    state = tmp_path / "state"
    (state / "instances").mkdir(parents=True)
    (state / "instances" / "dev.token").write_text("dev-instance")
    dev_env = {"AIWG_STATE_DIR": str(state)}
    assert resolve(None, None, None, dev_env).token == "dev-instance"
    (state / "admin-token").write_text("dev-admin")
    assert resolve(None, None, None, dev_env).token == "dev-admin"  # the admin token first


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("none", "no token: pass --token"),
        ("missing", "missing.token: No such file or directory"),
        ("empty", "empty.token is empty"),
    ],
)
def test_no_usable_token_is_one_message(tmp_path: Path, setup: str, message: str) -> None:
    env: dict[str, str] = {"AIWG_STATE_DIR": str(tmp_path / "nothing-here")}
    if setup == "missing":
        env["AIWG_TOKEN_FILE"] = str(tmp_path / "missing.token")
    if setup == "empty":
        (tmp_path / "empty.token").write_text("\n")
        env["AIWG_TOKEN_FILE"] = str(tmp_path / "empty.token")
    with pytest.raises(ApiError, match=message) as caught:
        resolve(None, None, None, env)
    assert caught.value.status == 0


def test_the_token_never_shows_and_paths_are_built_safely() -> None:
    api = Api("https://c.example:8122", "s3cret")
    assert "s3cret" not in repr(api)
    assert api.ws_base == "wss://c.example:8122" and Api("http://x", "t").ws_base == "ws://x"
    assert api.sessions_path("a/b c") == "/api/v2/admin/instances/a%2Fb%20c/sessions"
    assert api.with_headers({"A": "1"}).with_headers({"B": "2"}).headers == {"A": "1", "B": "2"}
    assert api.headers == {}


# -- against a real server -------------------------------------------------------------------------

ROUTES: dict[tuple[str, str], tuple[int, str, bytes]] = {
    ("GET", "/json"): (200, "application/json", b'{"ok": true}'),
    ("DELETE", "/empty"): (204, "application/json", b""),
    ("GET", "/a2a-error"): (
        404, "application/json", b'{"error": {"code": 404, "status": "NOT_FOUND", "message": "no task"}}',
    ),
    ("GET", "/problem"): (
        409, "application/problem+json", b'{"code": "instance.exists", "title": "Conflict", "detail": "taken"}',
    ),
    ("GET", "/problem-title"): (400, "application/problem+json", b'{"code": "x.y", "title": "Only a title"}'),
    ("GET", "/html"): (502, "text/html", b"<html>bad gateway</html>"),
    ("GET", "/other-json"): (500, "application/json", b'["what"]'),
    ("GET", "/api/v2/admin/instances"): (
        200, "application/json", b'{"items": [{"id": "id-1", "name": "alpha"}, {"id": "id-2", "name": "beta"}]}',
    ),
    ("POST", "/sse"): (
        200, "text/event-stream",
        b'data: {"n": 1}\n\nevent: message\ndata: {"n": 2}\n\n: comment\n\ndata: {"n": 3}\n\n',
    ),
    ("POST", "/sse-error"): (
        200, "text/event-stream",
        b'data: {"n": 1}\n\nevent: error\ndata: {"error": {"status": "UNAVAILABLE", "message": "hostd away"}}\n\n',
    ),
}  # fmt: skip


class _Handler(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append(  # type: ignore[attr-defined]
            {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
        )
        status, media, payload = ROUTES.get((self.command, self.path), (404, "text/plain", b"no route"))
        self.send_response(status)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}", httpd.seen  # type: ignore[attr-defined]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_a_call_sends_the_token_headers_and_json(server: tuple[str, list[dict[str, Any]]]) -> None:
    url, seen = server
    api = Api(url, "tok").with_headers({"A2A-Version": "1.0"})
    assert api.request("GET", "/json") == {"ok": True}
    assert api.request("DELETE", "/empty") is None
    assert list(api.sse("/sse", {"q": [1]})) == [{"n": 1}, {"n": 2}, {"n": 3}]
    get, delete, post = seen
    assert get["headers"]["Authorization"] == "Bearer tok" and get["headers"]["A2A-Version"] == "1.0"
    assert "Content-Type" not in get["headers"] and get["body"] == b"" and delete["method"] == "DELETE"
    assert post["headers"]["Content-Type"] == "application/json" and json.loads(post["body"]) == {"q": [1]}
    assert post["headers"]["Accept"] == "text/event-stream"


@pytest.mark.parametrize(
    ("path", "status", "code", "text"),
    [
        ("/a2a-error", 404, "NOT_FOUND", "NOT_FOUND: no task"),
        ("/problem", 409, "instance.exists", "instance.exists: taken"),
        ("/problem-title", 400, "x.y", "x.y: Only a title"),
        ("/html", 502, "", "HTTP 502 Bad Gateway"),
        ("/other-json", 500, "", "HTTP 500 Internal Server Error"),
    ],
)
def test_every_error_body_is_one_api_error(
    server: tuple[str, list[dict[str, Any]]], path: str, status: int, code: str, text: str
) -> None:
    with pytest.raises(ApiError) as caught:
        Api(server[0], "tok").request("GET", path)
    assert (caught.value.status, caught.value.code, str(caught.value)) == (status, code, text)
    if path == "/a2a-error":
        assert caught.value.body["error"]["message"] == "no task"  # kept for its details


def test_an_error_event_ends_the_stream(server: tuple[str, list[dict[str, Any]]]) -> None:
    events = Api(server[0], "tok").sse("/sse-error", {})
    assert next(events) == {"n": 1}
    with pytest.raises(ApiError, match="UNAVAILABLE: hostd away"):
        next(events)


def test_an_instance_by_id_or_by_name(server: tuple[str, list[dict[str, Any]]]) -> None:
    url, seen = server
    api = Api(url, "tok")
    uuid = "01a23ee9-7a85-7415-a6b2-01386dc88b7d"
    assert api.find_instance(uuid) == uuid and seen == []  # an id is not looked up
    assert api.find_instance("beta") == "id-2"
    with pytest.raises(ApiError, match="no instance named 'gamma'") as caught:
        api.find_instance("gamma")
    assert (caught.value.status, caught.value.code) == (404, "instance.not_found")


async def test_async_calls_run_in_a_thread(server: tuple[str, list[dict[str, Any]]]) -> None:
    api = Api(server[0], "tok")
    assert await api.call("GET", "/json") == {"ok": True}
    assert await api.instance_id("alpha") == "id-1"


def test_an_unreachable_controller() -> None:
    with pytest.raises(ApiError, match=r"cannot reach the controller at http://127\.0\.0\.1:9") as caught:
        Api("http://127.0.0.1:9", "tok").request("GET", "/json")  # the discard port: nothing listens
    assert caught.value.status == 0


def test_a_client_certificate_may_stand_in_for_the_token(tmp_path: Path) -> None:
    from tests.pki import Pki

    pki = Pki(tmp_path)
    robot = pki.client("robot")
    env = {"AIWG_STATE_DIR": str(tmp_path / "none"), "AIWG_CA_FILE": str(pki.ca)}
    api = resolve(
        "https://h:1", None, None, {**env, "AIWG_CLIENT_CERT": str(robot.cert), "AIWG_CLIENT_KEY": str(robot.key)}
    )
    assert api.token == "" and api.auth_headers == {} and api.tls is not None
    with pytest.raises(ApiError, match="needs both --cert and --key"):
        resolve("https://h:1", None, None, env, cert=str(robot.cert))
    with pytest.raises(ApiError, match="no token"):
        resolve("https://h:1", None, None, env)  # a CA alone is no credential
    with pytest.raises(ApiError, match="TLS files"):
        resolve("https://h:1", "t", None, env, cacert=str(tmp_path / "missing.pem"))
