"""The log ring: the controller's records as upstream's LogEntry, with the log format's ids, and never a token."""

from __future__ import annotations

import logging

import httpx
import msgspec

from agentic_sandbox.controller.events.logs import REDACTED, LogRing, level_word
from agentic_sandbox.proto import log_context
from tests.contracts import component, validate

from ..conftest import ADMIN_TOKEN, OPERATOR_TOKEN, LiveController

SECRET = "s3cret-token-" + "z" * 20


def _entries(ring: LogRing) -> list:
    return [r.value for r in ring.ring.read(0)[1]]


def test_records_become_log_entries_with_the_ids() -> None:
    logs = LogRing(16, secrets=[SECRET])
    log = logging.getLogger("controller.test_logring")
    log.addHandler(logs.handler)
    log.setLevel(1)
    try:
        with log_context(request_id="ab" * 16, instance_id="i-1", operation_id="op_1"):
            log.info("provisioned %s", "x")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("failed")
        log.log(5, "very fine")
    finally:
        log.removeHandler(logs.handler)
        log.setLevel(logging.NOTSET)
    first, second, third = _entries(logs)
    assert (first.level, first.target, first.message, first.trace_id) == (
        "info",
        "controller.test_logring",
        "provisioned x",
        "ab" * 16,
    )
    assert first.fields == {"operation_id": "op_1", "instance_id": "i-1", "logger_level": "INFO"}
    assert second.level == "error" and "RuntimeError: boom" in second.fields["exception"]
    assert third.level == "trace"
    for entry in (first, second, third):
        validate(msgspec.to_builtins(entry), component("LogEntry"))
    assert [level_word(n) for n in (5, 10, 20, 30, 40, 50)] == ["trace", "debug", "info", "warn", "error", "error"]


def test_tokens_never_reach_the_ring() -> None:
    logs = LogRing(16, secrets=[SECRET, ""])
    log = logging.getLogger("controller.test_logring.secret")
    log.addHandler(logs.handler)
    try:
        log.warning("token %s in a message", SECRET)
        log.warning("Authorization: Bearer %s", "some-other-credential")
        try:
            raise ValueError(f"bad token {SECRET}")
        except ValueError:
            log.exception("with a traceback")
    finally:
        log.removeHandler(logs.handler)
    text = repr(_entries(logs))
    assert SECRET not in text and "some-other-credential" not in text
    messages = [e.message for e in _entries(logs)]
    assert messages[0] == f"token {REDACTED} in a message"
    assert messages[1] == f"Authorization: Bearer {REDACTED}"


async def test_the_live_ring_shows_no_token(controller: LiveController, admin: httpx.AsyncClient) -> None:
    # Requests carrying each token, a wrong one, one in a path; and a careless line naming them.
    async with controller.client(OPERATOR_TOKEN) as operator, controller.client("wrong-" + ADMIN_TOKEN) as wrong:
        await operator.get("/api/v2/admin/instances")
        await wrong.get("/api/v2/admin/instances")
    await admin.get(f"/api/v2/admin/instances/{ADMIN_TOKEN}")
    await admin.get(f"/api/v2/admin/storage/inbox/{OPERATOR_TOKEN}/x")
    logging.getLogger("controller.careless").warning("tokens %s and %s", ADMIN_TOKEN, OPERATOR_TOKEN)
    r = await admin.get("/api/v2/admin/logs", params={"limit": "5000", "level": "trace"})
    assert r.status_code == 200
    assert any(e["target"] == "controller.careless" for e in r.json()["items"])
    assert ADMIN_TOKEN not in r.text and OPERATOR_TOKEN not in r.text
