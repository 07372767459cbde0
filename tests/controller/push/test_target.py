"""Webhook URLs: parsed strictly, and the addresses they resolve to judged public or not."""

from __future__ import annotations

import pytest

from agentic_sandbox.controller.errors import ValidationFailed
from agentic_sandbox.controller.push.target import check_literal, forbidden, parse_url, resolve


@pytest.mark.parametrize(
    "address",
    [
        *("127.0.0.1", "10.0.0.1", "172.16.5.4", "192.168.1.1", "169.254.169.254", "224.0.0.1", "0.0.0.0"),
        *("240.0.0.1", "::1", "fe80::1", "fc00::1", "ff02::1", "::", "::ffff:127.0.0.1", "100.64.0.1"),
        "198.18.0.1",
    ],
)
def test_private_and_special_addresses_are_forbidden(address: str) -> None:
    assert forbidden(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert not forbidden(address)


def test_urls_are_parsed_with_their_default_ports() -> None:
    url = parse_url("https://hooks.example.com/a/b?x=1")
    assert (url.scheme, url.host, url.port, url.path, url.host_header) == (
        "https",
        "hooks.example.com",
        443,
        "/a/b?x=1",
        "hooks.example.com",
    )
    assert parse_url("http://[::1]:8080").host_header == "[::1]:8080"
    assert parse_url("http://h").path == "/"


@pytest.mark.parametrize(
    "raw", ["", "h/x", "file:///etc/passwd", "http://", "http://u:p@h/", "http://h/a b", "http://h:99999/"]
)
def test_bad_urls_are_refused(raw: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_url(raw)
    assert caught.value.code == "push.invalid_url"


async def test_resolution_checks_the_address_it_returns() -> None:
    with pytest.raises(ValidationFailed):
        await resolve(parse_url("http://127.0.0.1:9/"), allow_private=False)
    target = await resolve(parse_url("http://127.0.0.1:9/"), allow_private=True)
    assert target.address == "127.0.0.1"


@pytest.mark.parametrize(
    "raw",
    [
        "http://127.0.0.1/x",
        "http://10.1.2.3/x",
        "http://[::1]:8/x",
        "http://[fe80::1%25eth0]/x",
        "http://localhost/x",
        "http://a.localhost./x",
    ],
)
def test_creation_refuses_private_literals_and_loopback_names(raw: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        check_literal(raw, allow_private=False)
    assert caught.value.code == "push.invalid_url"
    assert check_literal(raw, allow_private=True).path == "/x"


def test_creation_takes_names_unresolved_and_public_literals() -> None:
    assert check_literal("https://no-such-host.invalid/hook", allow_private=False).host == "no-such-host.invalid"
    assert check_literal("http://93.184.216.34/x", allow_private=False).port == 80
    with pytest.raises(ValidationFailed):
        check_literal("ftp://hooks.example.com/x", allow_private=False)
