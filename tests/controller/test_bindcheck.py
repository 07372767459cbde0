"""Why an address cannot be listened on, asked of the OS."""

from __future__ import annotations

import socket

from agentic_sandbox.controller.bindcheck import bind_error


def test_bind_error_names_the_reason_or_none() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert bind_error(f"127.0.0.1:{port}") is None  # binds (and is let go again)
    assert bind_error(f"127.0.0.1:{port}") is None
    assert bind_error("unix:/tmp/x.sock") is None  # not host:port: grpcio's own words stand
    assert bind_error("no-port") is None
    unresolvable = bind_error("no-such-host.invalid:50051")
    assert unresolvable is not None and unresolvable.startswith("[Errno")
    with socket.socket(socket.AF_INET6) as holder:
        holder.bind(("::1", 0))
        holder.listen()
        assert bind_error(f"[::1]:{holder.getsockname()[1]}") == "Address already in use"
