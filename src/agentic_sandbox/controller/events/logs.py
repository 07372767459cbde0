"""The controller's own log records, held in a bounded ring for ``GET /api/v2/admin/logs``.

A :class:`RingHandler` on the root logger turns each record the controller logs (the records
``AIWG_LOG_FORMAT`` writes to stderr, at the same threshold) into the contract's ``LogEntry`` and
appends it to a :class:`~controller.ring.Ring` (``AIWG_LOG_RING_SIZE`` entries). The fields are the
JSON log format's (:mod:`proto.logformat`): ``timestamp`` (its ``time``), ``level`` (Python's
level as the contract's word: ``trace`` below DEBUG, ``debug``, ``info``, ``warn``, ``error`` for
ERROR and CRITICAL), ``target`` (the logger name), ``message``, ``trace_id`` (the request id, the
W3C trace id of the HTTP request behind the line) and ``fields``: the other ids
(``operation_id``, ``instance_id``, ``session_id``, ``exec_id``), ``logger_level`` (Python's level
name) and ``exception`` when there is one.

Never a token: the configured bearer tokens are replaced by ``[redacted]`` wherever they occur in
a message or traceback, and so is whatever follows ``Bearer `` (the controller does not log
credentials; this holds if a library or a future line does). Records are appended from whatever
thread logs them; the ring never blocks the caller (see :mod:`controller.events.ring`).

Resource handling: :meth:`LogRing.install` adds the handler to the root logger and
:meth:`LogRing.uninstall` removes it; the app does both around serving.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

import msgspec

from agentic_sandbox.proto import current_log_ids
from agentic_sandbox.proto.logformat import LOG_IDS

from ..models import iso
from .ring import Ring

DEFAULT_CAPACITY = 4096
#: The contract's levels, lowest first.
LEVELS = ("trace", "debug", "info", "warn", "error")
#: A message longer than this is cut (a ring entry stays small).
MAX_MESSAGE_CHARS = 8192
REDACTED = "[redacted]"
_BEARER_RE = re.compile(r"(?i)(bearer\s+)[^\s\"',;]+")


class LogEntry(msgspec.Struct, kw_only=True, omit_defaults=True):
    """admin-api ``LogEntry``."""

    timestamp: str
    level: str
    target: str
    message: str
    fields: dict[str, Any] = {}
    trace_id: str | None = None


def level_word(levelno: int) -> str:
    if levelno < logging.DEBUG:
        return "trace"
    if levelno < logging.INFO:
        return "debug"
    if levelno < logging.WARNING:
        return "info"
    if levelno < logging.ERROR:
        return "warn"
    return "error"


def _log_event(_entry: LogEntry) -> str:
    return "log"


class RingHandler(logging.Handler):
    """Appends each record to the ring as a ``LogEntry`` (see the module docstring)."""

    def __init__(self, ring: Ring[LogEntry], secrets: Iterable[str]) -> None:
        super().__init__()
        self.ring = ring
        # Longest first, so a token that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._formatter = logging.Formatter()

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return _BEARER_RE.sub(r"\g<1>" + REDACTED, text)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if len(message) > MAX_MESSAGE_CHARS:
                message = message[:MAX_MESSAGE_CHARS] + "…"
            context = current_log_ids()
            ids = {}
            for key in LOG_IDS:
                value = record.__dict__[key] if key in record.__dict__ else context.get(key)
                if value is not None:
                    ids[key] = str(value)
            fields: dict[str, Any] = {k: v for k, v in ids.items() if k != "request_id"}
            fields["logger_level"] = record.levelname
            if record.exc_info:
                fields["exception"] = self._scrub(self._formatter.formatException(record.exc_info))
            self.ring.append(
                LogEntry(
                    timestamp=iso(record.created),
                    level=level_word(record.levelno),
                    target=record.name,
                    message=self._scrub(message),
                    fields=fields,
                    trace_id=ids.get("request_id"),
                )
            )
        except Exception:  # a log call must never fail because of the ring
            self.handleError(record)


class LogRing:
    """The ring plus its handler; one per app (``AppState.logs``)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, *, secrets: Iterable[str] = ()) -> None:
        self.ring: Ring[LogEntry] = Ring(capacity, _log_event)
        self.handler = RingHandler(self.ring, secrets)

    def install(self) -> None:
        logging.getLogger().addHandler(self.handler)

    def uninstall(self) -> None:
        logging.getLogger().removeHandler(self.handler)
