"""The PTY surface's blueprint (the legacy v1 socket's route registers on it)."""

from __future__ import annotations

from quart import Blueprint

pty = Blueprint("pty", __name__)
