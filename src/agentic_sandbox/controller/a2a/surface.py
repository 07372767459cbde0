"""The A2A surface as the app registers it: the blueprint with every route module registered on it."""

from __future__ import annotations

from . import discovery, jsonrpc, rest  # noqa: F401  (routes register on import)
from .blueprint import a2a, error_response, from_http_exception

__all__ = ["a2a", "error_response", "from_http_exception"]
