"""The PTY surface as the app registers it: the blueprint with the legacy socket's route on it (the
pty-ws/v1 attach socket is served on ASGI by :mod:`.route`, not through the blueprint)."""

from __future__ import annotations

from . import legacy  # noqa: F401  (its route registers on import)
from .blueprint import pty

__all__ = ["pty"]
