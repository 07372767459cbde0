"""proto.logformat in memory: JSON lines, ids from the context (tasks and threads inherit them), settings."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from agentic_sandbox.proto import (
    LogConfigError,
    bind_log_ids,
    configure_logging,
    current_log_ids,
    log_context,
    logs_as_json,
)
from agentic_sandbox.proto.logformat import JsonFormatter

RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


class Lines:
    """What the ``aiwg.test`` logger wrote, as JSON lines parsed back (re-read on every look)."""

    def __init__(self, stream: io.StringIO) -> None:
        self.stream = stream

    def __call__(self) -> list[dict[str, Any]]:
        text = self.stream.getvalue()
        assert not text or text.endswith("\n")
        return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def lines() -> Iterator[Lines]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("aiwg.test")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield Lines(stream)
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, given back with its own handlers and level afterwards (pytest's capture)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    root.handlers.clear()  # so that configure_logging(force=True) does not close pytest's
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


log = logging.getLogger("aiwg.test")


def test_a_json_line_has_the_fields(lines: Lines) -> None:
    log.warning("two\nlines and a \udcff byte: %s", "arg")
    (line,) = lines()
    assert list(line) == ["time", "level", "logger", "message"]
    assert RFC3339_UTC.match(line["time"]), line["time"]
    assert line["level"] == "WARNING" and line["logger"] == "aiwg.test"
    assert line["message"] == "two\nlines and a \udcff byte: arg"


def test_exception_text_is_included(lines: Lines) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("it failed")
    line = lines()[0]
    assert line["message"] == "it failed"
    assert line["exception"].startswith("Traceback") and "RuntimeError: boom" in line["exception"]


def test_ids_come_from_the_context_and_extra_wins(lines: Lines) -> None:
    log.info("no ids")
    with log_context(instance_id="i-1", session_id=None):
        with log_context(session_id="s-1"):
            log.info("both")
            log.info("explicit", extra={"instance_id": "i-2", "exec_id": "e-1"})
        log.info("outer")
    log.info("after")
    ids = [{k: v for k, v in line.items() if k.endswith("_id")} for line in lines()]
    assert ids == [
        {},
        {"instance_id": "i-1", "session_id": "s-1"},
        {"instance_id": "i-2", "session_id": "s-1", "exec_id": "e-1"},
        {"instance_id": "i-1"},
        {},
    ]
    assert list(lines()[2])[4:] == ["instance_id", "session_id", "exec_id"]  # the order of LOG_IDS
    with pytest.raises(TypeError, match="token"):  # only known ids: nothing else rides into the logs
        bind_log_ids(token="x")


async def test_tasks_and_threads_inherit_the_ids(lines: Lines) -> None:
    async def task() -> None:
        bind_log_ids(exec_id="e-9")  # for this task only
        log.info("in a task")

    async with trio.open_nursery() as nursery:
        with log_context(request_id="r-1", operation_id="op_1"):
            nursery.start_soon(task)
            await trio.to_thread.run_sync(log.info, "in a thread")
        log.info("parent, outside")
    assert current_log_ids() == {}
    by_message = {line["message"]: line for line in lines()}
    assert by_message["in a thread"]["request_id"] == "r-1"
    assert by_message["in a task"]["operation_id"] == "op_1" and by_message["in a task"]["exec_id"] == "e-9"
    assert "request_id" not in by_message["parent, outside"]


def test_configure_logging_formats_and_levels(root_logger: logging.Logger) -> None:
    stream = io.StringIO()
    assert configure_logging({}, stream=stream) == "text"
    assert not logs_as_json()
    logging.getLogger("aiwg.cfg").debug("hidden at INFO")
    logging.getLogger("aiwg.cfg").info("shown")
    assert "hidden" not in stream.getvalue() and " INFO aiwg.cfg: shown" in stream.getvalue()

    stream = io.StringIO()
    assert configure_logging({"AIWG_LOG_FORMAT": "json", "AIWG_LOG_LEVEL": "debug"}, stream=stream) == "json"
    assert logs_as_json() and len(logging.getLogger().handlers) == 1
    logging.getLogger("aiwg.cfg").debug("now shown")
    assert json.loads(stream.getvalue())["message"] == "now shown"
    configure_logging({"AIWG_LOG_LEVEL": "error"}, level="warning", stream=stream)  # a flag wins
    assert root_logger.level == logging.WARNING


@pytest.mark.parametrize(
    ("env", "level", "named"),
    [
        ({"AIWG_LOG_FORMAT": "xml"}, None, "AIWG_LOG_FORMAT"),
        ({"AIWG_LOG_FORMAT": "json "}, None, None),
        ({"AIWG_LOG_LEVEL": "verbose"}, None, "AIWG_LOG_LEVEL"),
        ({}, "loud", "--log-level"),
    ],
)
def test_bad_settings_name_the_variable(
    root_logger: logging.Logger, env: dict[str, str], level: str | None, named: str | None
) -> None:
    stream = io.StringIO()
    if named is None:
        configure_logging(env, level=level, stream=stream)
        return
    before = list(root_logger.handlers)
    with pytest.raises(LogConfigError, match=re.escape(named)):
        configure_logging(env, level=level, stream=stream)
    assert root_logger.handlers == before  # nothing half-configured
