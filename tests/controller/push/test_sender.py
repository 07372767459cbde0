"""Webhook POSTs against real local receivers: pinned address, no redirects, verified https,
kept-alive connections per origin."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agentic_sandbox.controller.errors import ValidationFailed
from agentic_sandbox.controller.push.sender import DeliveryFailed, Sender, post
from agentic_sandbox.controller.push.target import Target, parse_url

from .receiver import Receiver

HEADERS = [("Content-Type", "application/a2a+json")]
BODY = b'{"statusUpdate": {"taskId": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}}'


def self_signed(tmp: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


async def test_the_post_goes_to_the_checked_address_with_the_name_as_host() -> None:
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.serve)
        # The name does not resolve at all: only the pinned address can have been connected to.
        target = Target(parse_url(f"http://hooks.invalid:{receiver.port}/in?x=1"), "127.0.0.1")
        assert await post(target, BODY, HEADERS, timeout=5) == 200
        [got] = receiver.received
        assert got.headers["host"] == f"hooks.invalid:{receiver.port}" and got.path == "/in?x=1"
        assert got.body["statusUpdate"]["taskId"] == "t"
        nursery.cancel_scope.cancel()


async def test_redirects_are_not_followed() -> None:
    receiver = Receiver(status=302)
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.serve)
        target = Target(parse_url(receiver.url), "127.0.0.1")
        with pytest.raises(DeliveryFailed, match="302"):
            await post(target, BODY, HEADERS, timeout=5)
        assert receiver.attempts == 1
        nursery.cancel_scope.cancel()


async def test_https_certificates_are_verified_against_the_name(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "hooks.test")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    names: list[str | None] = []
    server.sni_callback = lambda _sock, name, _ctx: names.append(name)  # type: ignore[assignment,func-returns-value]
    receiver = Receiver(tls=server)
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.serve)
        url = f"https://hooks.test:{receiver.port}/hook"
        # Not trusted by the system store: refused.
        with pytest.raises(DeliveryFailed, match="CERTIFICATE_VERIFY_FAILED"):
            await post(Target(parse_url(url), "127.0.0.1"), BODY, HEADERS, timeout=5)
        trusted = ssl.create_default_context(cafile=str(cert))
        # Trusted, but for another name: refused.
        other = f"https://other.test:{receiver.port}/hook"
        with pytest.raises(DeliveryFailed):
            await post(Target(parse_url(other), "127.0.0.1"), BODY, HEADERS, timeout=5, tls=trusted)
        assert await post(Target(parse_url(url), "127.0.0.1"), BODY, HEADERS, timeout=5, tls=trusted) == 200
        assert names[-1] == "hooks.test" and receiver.received[-1].headers["host"] == f"hooks.test:{receiver.port}"
        nursery.cancel_scope.cancel()


async def test_connections_are_kept_alive_per_origin_and_a_closed_one_is_replaced() -> None:
    keeps, closes = Receiver(keep_alive=True), Receiver()
    sender = Sender(allow_private=True, timeout=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(keeps.serve)
        await nursery.start(closes.serve)
        for _ in range(5):
            assert await sender.post(parse_url(keeps.url), BODY, HEADERS) == 200
        assert keeps.connections == 1 and len(keeps.received) == 5  # one connection for all five
        # Another origin gets a connection of its own; a receiver that closes each connection
        # after its answer is still delivered to (the closed connection is replaced, once).
        for _ in range(3):
            assert await sender.post(parse_url(closes.url), BODY, HEADERS) == 200
        assert closes.connections == 3 and len(closes.received) == 3
        # Errors keep the connection too (the exchange was complete); redirects are still failures.
        keeps.status = 302
        with pytest.raises(DeliveryFailed, match="302"):
            await sender.post(parse_url(keeps.url), BODY, HEADERS)
        assert keeps.connections == 1
        # Private addresses are checked when a connection is opened: refused before connecting.
        strict = Sender(allow_private=False, timeout=5)
        with pytest.raises(ValidationFailed, match="loopback"):
            await strict.post(parse_url(keeps.url), BODY, HEADERS)
        assert keeps.connections == 1 and strict.opened == 0
        sender.close()
        nursery.cancel_scope.cancel()
