"""Log output both daemons share: plain text (the default) or one JSON object per line.

Settings, read by :func:`configure_logging` first thing at start (before the daemon's own
configuration, whose loading may log); a bad value raises :class:`LogConfigError` naming the
variable, which the daemon reports as a configuration error:

``AIWG_LOG_FORMAT``
    ``text`` (default: ``<time> <LEVEL> <logger>: <message>``, for a terminal) or ``json`` (for
    journald and log shippers).
``AIWG_LOG_LEVEL``
    ``DEBUG``, ``INFO`` (default), ``WARNING``, ``ERROR`` or ``CRITICAL``.

A JSON line holds ``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``message``, then
the ids the line concerns (:data:`LOG_IDS`, only those known) and ``exception`` (the formatted
traceback) when there is one. Newlines inside a message are escaped, so a line is always one record.

Where the ids come from: a context variable, so no log call has to pass them. A daemon sets them
where it learns them (:func:`log_context` around a piece of work, :func:`bind_log_ids` for the rest
of a task); trio tasks and ``trio.to_thread`` workers started from there copy the context and
carry the ids too. An id given explicitly (``log.info(..., extra={"instance_id": ...})``) wins.

Never log a token, an env file or instance environment values: nothing here filters messages.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from types import MappingProxyType
from typing import IO, Any

#: The ids a log line may concern, in the order a JSON line lists them.
LOG_IDS = ("request_id", "operation_id", "instance_id", "session_id", "exec_id")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_EMPTY: Mapping[str, str] = MappingProxyType({})
_log_ids: ContextVar[Mapping[str, str]] = ContextVar("aiwg_log_ids", default=_EMPTY)


class LogConfigError(ValueError):
    """``AIWG_LOG_FORMAT`` or ``AIWG_LOG_LEVEL`` is invalid; the message names it."""


# -- the ids -------------------------------------------------------------------------------------


def current_log_ids() -> Mapping[str, str]:
    """The ids set for the running task (read-only)."""
    return _log_ids.get()


def _merged(ids: Mapping[str, str | None]) -> Mapping[str, str]:
    unknown = set(ids) - set(LOG_IDS)
    if unknown:
        raise TypeError(f"unknown log id(s) {sorted(unknown)}; known: {', '.join(LOG_IDS)}")
    return MappingProxyType({**_log_ids.get(), **{key: value for key, value in ids.items() if value}})


@contextmanager
def log_context(**ids: str | None) -> Iterator[None]:
    """Add ``ids`` (None and empty values are skipped) for the body of the ``with``, then restore."""
    token = _log_ids.set(_merged(ids))
    try:
        yield
    finally:
        _log_ids.reset(token)


def bind_log_ids(**ids: str | None) -> None:
    """Add ``ids`` for the rest of the current task (and what it starts): for a task's own work."""
    _log_ids.set(_merged(ids))


# -- formatting ----------------------------------------------------------------------------------


def _rfc3339(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring for the fields).

    The ids are read from the context when the record is formatted, which is in the logging task
    for the stream handler :func:`configure_logging` installs.
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _rfc3339(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = _log_ids.get()
        for key in LOG_IDS:
            # An explicit ``extra`` sets the attribute on the record, and wins (even as None).
            value = record.__dict__[key] if key in record.__dict__ else context.get(key)
            if value is not None:
                line[key] = str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # ensure_ascii: any byte a message carries (surrogate escapes included) stays encodable.
        return json.dumps(line, ensure_ascii=True, default=str)


def _choice(raw: str, choices: tuple[str, ...], source: str) -> str:
    """``raw`` (case-insensitive) if it is one of ``choices``; else LogConfigError naming ``source``."""
    for choice in choices:
        if raw.strip().lower() == choice.lower():
            return choice
    raise LogConfigError(f"{source}={raw!r} must be one of {', '.join(choices)}")


def configure_logging(
    env: Mapping[str, str] | None = None, *, level: str | None = None, stream: IO[str] | None = None
) -> str:
    """Send every log record to ``stream`` (stderr) in the configured format; return that format.

    ``level`` (a command-line flag) overrides ``AIWG_LOG_LEVEL``. Replaces any handler already on
    the root logger, so calling it twice does not duplicate lines.
    """
    env = os.environ if env is None else env
    fmt = _choice(env.get("AIWG_LOG_FORMAT") or "text", LOG_FORMATS, "AIWG_LOG_FORMAT")
    if level is None:
        threshold = _choice(env.get("AIWG_LOG_LEVEL") or "INFO", LOG_LEVELS, "AIWG_LOG_LEVEL")
    else:
        threshold = _choice(level, LOG_LEVELS, "--log-level (AIWG_LOG_LEVEL)")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=threshold, handlers=[handler], force=True)
    return fmt


def logs_as_json() -> bool:
    """Whether the root logger writes JSON lines (a daemon's plain prints should then log instead)."""
    return any(isinstance(handler.formatter, JsonFormatter) for handler in logging.getLogger().handlers)
