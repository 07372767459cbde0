"""The controller: the only process clients talk to; it never runs a process (hostd does).

General layout: ``config`` (settings), ``app`` (``create_app``: blueprints and per-app state),
``main`` (``agentic-controller``). Surfaces: ``admin/`` (``/api/v2/admin``), ``observability``,
``v1`` (compatibility). Services: ``hostlink`` (the hostd connection), ``store`` (SQLite),
``operations``, ``instances``, ``auth``, ``storage``, ``loadouts``, ``images``. Edges: ``problems``
(problem+json), ``models`` (JSON shapes), ``metrics``, ``guard`` (the process guard).

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
