"""agentic-sandbox executor: a host supervisor daemon and a thin A2A/admin controller.

General layout (one import name; the packages never import each other, only ``proto``):

- ``proto``: the hostd RPC contract both sides share (Structs, framing, errors, the trio client).
- ``hostd``: the root daemon that owns every process tree, PTY, container and VM on the host.
- ``controller``: the A2A, admin, observability and v1 surfaces; it never starts a process.
- ``cli``: the clients people type, ``agentic-hostctl`` (hostd's socket) and ``agentic`` (HTTP).
"""
