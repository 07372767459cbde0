"""The controller: the only process clients talk to; it never runs a process (hostd does).

General layout: ``config`` (settings), ``app`` (``create_app``: blueprints), ``state`` (the typed
per-app state holding every service), ``main`` (``agentic-controller``). Surfaces: ``admin/``
(``/api/v2/admin``; ``admin/views`` makes its JSON shapes), ``observability``, ``v1``
(compatibility). Services, which know no HTTP: ``hostlink`` (the hostd connection and the one
translation of hostd's errors), ``store/`` (SQLite), ``operations``, ``instances``, ``storage``,
``loadouts``, ``images``; they raise only ``errors``. ``auth`` holds the tokens and the routes' role
check. Edges: ``problems`` (the errors as problem+json), ``decoding`` (request bodies), ``models``
(JSON shapes), ``metrics``, ``guard`` (the process guard).

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
