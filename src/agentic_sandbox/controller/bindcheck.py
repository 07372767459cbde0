"""Why an address cannot be listened on, in the operating system's words.

Servers that bind in a library (grpcio says only "Failed to bind"; hypercorn raises from inside its
lifespan, after the app's services started) leave an operator a traceback or nothing. The
controller asks the OS itself: :func:`bind_error` binds the address the way those servers do
(address reuse on, port reuse off) and lets go at once, before serving (HTTP) or after a library
failed (gRPC). Nothing stays bound.
"""

from __future__ import annotations

import socket


def bind_error(listen: str) -> str | None:
    """Why ``listen`` (``host:port``) cannot be bound, asked of the OS the way grpcio binds it
    (address reuse on, port reuse off): its reason (``Address already in use``), or None when it
    binds now or is no ``host:port``. A diagnosis, after grpcio has failed: nothing stays bound."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        return None
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        addresses = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return str(exc)
    errors: list[str] = []
    for family, kind, proto, _name, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                errors.append(exc.strerror or str(exc))
    return errors[0] if errors else None
