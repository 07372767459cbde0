"""The controller: the only process clients talk to; it never runs a process (hostd does).

General layout, by capability (services know no HTTP; a test checks it, and that no import cycle
exists):

- At the root: ``config`` (settings), ``app`` (``create_app``: builds every service with what it
  uses, registers the surfaces), ``state`` (the typed per-app state route handlers read their
  services from), ``main`` (``agentic-controller``), ``guard`` (the process guard), ``errors`` (the
  services' one error family), ``hostlink`` (the hostd connection and the one translation of hostd's
  errors), ``operations``, ``storage``, ``models`` (the admin contract's JSON shapes), ``metrics``,
  ``decoding``, ``ulid``.
- Service wings: ``instances/`` (catalog, provisioning, pools, checkpoints, sessions, watch),
  ``tasks/`` (A2A tasks run through hostd), ``push/`` (push notification delivery), ``store/``
  (SQLite), ``events/`` (event bus, log ring), ``loadouts/``, ``auth/`` (tokens, instance
  credentials).
- Surfaces: ``admin/`` (``/api/v2/admin``), ``a2a/`` (``/agents/{id}``: its service layer beside its
  bindings), ``pty/`` (the attach WebSocket), ``console/`` (``/console/``), ``observability``,
  ``v1`` (compatibility); ``http/`` is the edge they share (responses, the role check, problem+json).

``create_app`` is imported lazily so that importing a leaf module (``controller.config``) does not
build the whole app import graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import ConfigError, ControllerConfig, load_config

if TYPE_CHECKING:
    from .app import create_app

__all__ = ["ConfigError", "ControllerConfig", "create_app", "load_config"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module 'controller' has no attribute {name!r}")
