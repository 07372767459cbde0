"""mTLS on every surface: client certificates made by a real CA (``cryptography``), verified by the
controller's TLS listener, against a real hostd.

The matrix: no certificate, an untrusted one (another CA), a trusted one not on the allow-list and
an allowed one, each with and without a valid bearer token, on the admin API, the v1 API, A2A
over REST and JSON-RPC, an SSE stream, a PTY attach over WSS, the web console, a public path, and
(``required``) A2A over gRPC. A presented certificate decides before the token, as upstream orders
it: allowed is the admin, not allowed is 403 with no fallback to the token.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
import trio
from a2a.types import a2a_pb2, a2a_pb2_grpc
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus

from agentic_sandbox.controller.auth.mtls import ClientCertificate
from agentic_sandbox.controller.config import load_config
from tests.controller.a2a.helpers import A2A_HEADERS
from tests.controller.conftest import ADMIN_TOKEN, LiveController, LiveHostd, controller_env, serve_controller
from tests.controller.pty.wsclient import WS, attach_url
from tests.pki import Issued, Pki

#: A TLS failure: the handshake (or the first read after it, in TLS 1.3) was refused.
TLS = "tls"
ADMIN_NAME = "ops-admin.example"

Outcome = int | str


@dataclass
class Setup:
    live: LiveController
    pki: Pki
    certs: dict[str, Issued | None]
    instance_id: str
    session_id: str


def context_for(pki: Pki, cert: Issued | None) -> ssl.SSLContext:
    if cert is None:
        return ssl.create_default_context(cafile=str(pki.ca))
    return cert.client_context(pki.ca)


@pytest.fixture(params=["optional", "required"])
async def setup(request: pytest.FixtureRequest, hostd: LiveHostd, tmp_path: Path) -> AsyncIterator[Setup]:
    pki = Pki(tmp_path / "pki")
    stranger = Pki(tmp_path / "other-pki", "stranger-ca")
    server = pki.server()
    certs: dict[str, Issued | None] = {
        "none": None,
        "untrusted": stranger.client(ADMIN_NAME),  # the allowed name, from a CA nobody trusts
        "not-allowed": pki.client("intruder.example"),
        "allowed": pki.client("someone", dns=(ADMIN_NAME,)),  # allowed by a subject alternative name
    }
    env = controller_env(
        tmp_path / "c",
        hostd.socket_path,
        AIWG_TLS_CERT=str(server.cert),
        AIWG_TLS_KEY=str(server.key),
        AIWG_TLS_CLIENT_AUTH=request.param,
        AIWG_TLS_CLIENT_CA=str(pki.ca),
        AIWG_MTLS_ADMIN_ALLOWLIST=f"ci-robot,{ADMIN_NAME}",
        AIWG_GRPC_LISTEN="127.0.0.1:0",
    )
    async with serve_controller(load_config(env=env)) as live:
        allowed = certs["allowed"]
        async with httpx.AsyncClient(base_url=live.url, verify=context_for(pki, allowed), timeout=20) as admin:
            body = {"name": "mtls", "runtime": "host", "loadout": "shell", "start": True}
            response = await admin.post("/api/v2/admin/instances", json=body)
            assert response.status_code == 202, response.text
            op_id = response.json()["id"]
            with trio.fail_after(20):
                while (op := (await admin.get(f"/api/v2/admin/operations/{op_id}")).json())["state"] != "succeeded":
                    assert op["state"] in ("pending", "running"), op
                    await trio.sleep(0.05)
            instance_id = op["result"]["instance_id"]
            response = await admin.post(f"/api/v2/admin/instances/{instance_id}/sessions", json={"argv": ["/bin/cat"]})
            assert response.status_code == 201, response.text
            yield Setup(live, pki, certs, instance_id, response.json()["id"])


async def http_probe(
    setup: Setup, cert: Issued | None, token: str | None, method: str, path: str, **kw: object
) -> Outcome:
    headers = {**A2A_HEADERS, **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        async with httpx.AsyncClient(
            base_url=setup.live.url, verify=context_for(setup.pki, cert), headers=headers, timeout=10
        ) as client:
            if path.startswith("/api/v2/admin/events"):
                async with client.stream(method, path) as response:  # an SSE stream: the head is enough
                    if response.status_code == 200:
                        assert response.headers["content-type"].startswith("text/event-stream")
                    return response.status_code
            return (await client.request(method, path, **kw)).status_code  # type: ignore[arg-type]
    except (httpx.TransportError, ssl.SSLError):
        return TLS


async def pty_probe(setup: Setup, cert: Issued | None, token: str | None) -> Outcome:
    url = attach_url(setup.live.url, setup.instance_id, setup.session_id)
    try:
        ws = await WS.connect(url, token=token, ssl=context_for(setup.pki, cert))
    except InvalidStatus as exc:
        return exc.response.status_code
    except (OSError, ssl.SSLError, EOFError, InvalidMessage, ConnectionClosed):  # refused in or after the handshake
        return TLS
    try:
        hello = await ws.json()
        assert hello["op"] == "binding_hello"
        return 200
    finally:
        await ws.close()


def grpc_probe(setup: Setup, cert: Issued | None, token: str | None) -> Outcome:
    port = setup.live.state.a2a.grpc_port
    pair = (cert.key.read_bytes(), cert.cert.read_bytes()) if cert else (None, None)
    credentials = grpc.ssl_channel_credentials(setup.pki.ca.read_bytes(), *pair)
    metadata = [("a2a-version", "1.0"), *([("authorization", f"Bearer {token}")] if token else [])]
    with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        try:
            stub.GetTask(
                a2a_pb2.GetTaskRequest(tenant=setup.instance_id, id="no-such-task"), metadata=metadata, timeout=10
            )
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNAVAILABLE:
                return TLS
            return {
                grpc.StatusCode.NOT_FOUND: 200,  # past authentication: the task is what is missing
                grpc.StatusCode.UNAUTHENTICATED: 401,
                grpc.StatusCode.PERMISSION_DENIED: 403,
            }.get(code, str(code))
    return 200


def surfaces(setup: Setup) -> dict[str, Callable[[Issued | None, str | None], Awaitable[Outcome]]]:
    iid = setup.instance_id
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageSize": 1}}
    return {
        "admin": lambda c, t: http_probe(setup, c, t, "GET", "/api/v2/admin/instances"),
        "v1": lambda c, t: http_probe(setup, c, t, "GET", "/api/v1/agents"),
        "a2a-rest": lambda c, t: http_probe(setup, c, t, "GET", f"/agents/{iid}/v1/tasks"),
        "a2a-jsonrpc": lambda c, t: http_probe(setup, c, t, "POST", f"/agents/{iid}/", json=rpc),
        "sse": lambda c, t: http_probe(setup, c, t, "GET", "/api/v2/admin/events?follow=true"),
        "console": lambda c, t: http_probe(setup, c, t, "GET", "/console/"),
        "public": lambda c, t: http_probe(setup, c, t, "GET", "/healthz/http"),
        "pty-wss": lambda c, t: pty_probe(setup, c, t),
    }


def expected(mode: str, cert: str, token: bool, surface: str) -> Outcome:
    if cert == "untrusted" or (cert == "none" and mode == "required"):
        return TLS
    if surface == "public":
        return 200
    if cert == "not-allowed":
        return 403
    if cert == "allowed" or token:
        return 200
    return 200 if surface == "console" else 401  # the console's files are public; it signs in in the page


async def test_the_certificate_decides_before_the_token_on_every_surface(setup: Setup) -> None:
    mode = setup.live.config.tls_client_auth
    got: dict[tuple[str, str, bool], Outcome] = {}
    want: dict[tuple[str, str, bool], Outcome] = {}
    for cert_name, cert in setup.certs.items():
        for token in (False, True):
            for surface, probe in surfaces(setup).items():
                key = (cert_name, surface, token)
                got[key] = await probe(cert, ADMIN_TOKEN if token else None)
                want[key] = expected(mode, cert_name, token, surface)
    assert got == want


async def test_grpc_takes_the_certificate_when_it_is_required(setup: Setup) -> None:
    """grpcio demands a verified certificate or asks for none: with ``optional`` its callers use
    tokens, with ``required`` the certificate decides there as on HTTP."""
    mode = setup.live.config.tls_client_auth
    for cert_name, cert in setup.certs.items():
        for token in (None, ADMIN_TOKEN):
            got = await trio.to_thread.run_sync(grpc_probe, setup, cert, token)
            if mode == "optional":
                want: Outcome = 200 if token else 401
            elif cert_name in ("none", "untrusted"):
                want = TLS
            else:
                want = 200 if cert_name == "allowed" else 403
            assert got == want, (mode, cert_name, token)


async def test_an_allowed_certificate_wins_over_a_wrong_token(setup: Setup) -> None:
    allowed = setup.certs["allowed"]
    assert await http_probe(setup, allowed, "not-a-token-at-all", "GET", "/api/v2/admin/instances") == 200
    refused = setup.certs["not-allowed"]
    assert (
        await http_probe(setup, refused, ADMIN_TOKEN, "DELETE", f"/api/v2/admin/instances/{setup.instance_id}") == 403
    )


def test_names_are_the_common_name_then_dns_and_uri_alternative_names(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    issued = pki.client("robot", dns=("robot.example",), uris=("spiffe://example/robot",))
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    der = x509.load_pem_x509_certificate(issued.cert.read_bytes()).public_bytes(Encoding.DER)
    cert = ClientCertificate.from_der(der)
    assert cert.names == ("robot", "robot.example", "spiffe://example/robot")
    assert cert.allowed(frozenset({"spiffe://example/robot"})) and not cert.allowed(frozenset({"other"}))


async def test_the_cli_speaks_mtls_with_a_certificate_for_a_token(setup: Setup) -> None:
    """``agentic --cacert --cert --key``: the certificate is the credential; a refused one says so."""

    def agentic(cert: Issued | None) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "agentic_sandbox.cli.agentic", "--url", setup.live.url]
        argv += ["--cacert", str(setup.pki.ca)]
        if cert is not None:
            argv += ["--cert", str(cert.cert), "--key", str(cert.key)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIWG_")}
        env["AIWG_STATE_DIR"] = str(Path(setup.live.config.state_dir) / "nowhere")  # no dev token to find
        return subprocess.run([*argv, "tasks", setup.instance_id], capture_output=True, text=True, env=env, timeout=60)

    allowed = await trio.to_thread.run_sync(agentic, setup.certs["allowed"])
    assert allowed.returncode == 0, allowed.stderr
    refused = await trio.to_thread.run_sync(agentic, setup.certs["not-allowed"])
    assert refused.returncode == 1 and "auth.forbidden" in refused.stderr, refused.stderr
