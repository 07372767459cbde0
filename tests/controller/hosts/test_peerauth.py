"""The signature one controller puts on a request it forwards, and what the peer accepts."""

from __future__ import annotations

from agentic_sandbox.controller.auth.tokens import Principal
from agentic_sandbox.controller.hosts.peerauth import PeerSigner, request_target

SECRET = bytes(range(32))
ADMIN = Principal(role="admin", label="admin")
INSTANCE = Principal(role="instance", label="instance:i-1", instance_id="i-1")


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_signed_caller_and_origin_come_back_as_they_were() -> None:
    signer = PeerSigner(SECRET)
    for principal in (ADMIN, INSTANCE, None):
        header = signer.header(principal, "POST", "/agents/i-1/message:send", "https://edge.example:8443")
        assert signer.verify(header, "POST", "/agents/i-1/message:send") == (principal, "https://edge.example:8443")


def test_a_signature_holds_for_its_own_request_only() -> None:
    signer = PeerSigner(SECRET)
    header = signer.header(INSTANCE, "GET", "/agents/i-1/tasks?pageSize=1", "http://a:1")
    assert signer.verify(header, "GET", "/agents/i-1/tasks?pageSize=1") is not None
    assert signer.verify(header, "DELETE", "/agents/i-1/tasks?pageSize=1") is None  # another method
    assert signer.verify(header, "GET", "/agents/i-2/tasks?pageSize=1") is None  # another target
    assert signer.verify(header, "GET", "/agents/i-1/tasks?pageSize=2") is None  # another query
    assert PeerSigner(b"another secret").verify(header, "GET", "/agents/i-1/tasks?pageSize=1") is None


def test_a_changed_field_or_a_forged_header_is_refused() -> None:
    signer = PeerSigner(SECRET)
    version, stamp, caller, origin, mac = signer.header(INSTANCE, "GET", "/x", "http://a:1").split(".")
    admin_caller = signer.header(ADMIN, "GET", "/x", "http://a:1").split(".")[2]
    for parts in (
        (version, stamp, admin_caller, origin, mac),  # a caller swapped in
        (version, str(int(stamp) + 1), caller, origin, mac),  # another time
        ("v2", stamp, caller, origin, mac),
        (version, stamp, caller, origin, mac[:-2] + "AA"),
    ):
        assert signer.verify(".".join(parts), "GET", "/x") is None
    for junk in ("", "v1", "v1.1.2.3", "v1.x.-.-.-", "v1.1.-.-.-.-"):
        assert signer.verify(junk, "GET", "/x") is None


def test_a_signature_older_or_newer_than_the_skew_is_refused() -> None:
    clock = Clock(1_000_000.0)
    signer = PeerSigner(SECRET, clock=clock)
    header = signer.header(ADMIN, "GET", "/x")
    clock.now += 29
    assert signer.verify(header, "GET", "/x") is not None
    clock.now += 2
    assert signer.verify(header, "GET", "/x") is None
    clock.now = 1_000_000.0 - 31  # a peer's clock ahead of this one
    assert signer.verify(header, "GET", "/x") is None


def test_the_target_is_the_path_and_the_query() -> None:
    assert request_target({"path": "/a/b", "query_string": b""}) == "/a/b"
    assert request_target({"path": "/a b", "query_string": b"x=1&y=%20"}) == "/a b?x=1&y=%20"
