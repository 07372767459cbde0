"""What the admin surface shows: records from the services turned into the contract's JSON shapes.

Services return records (:mod:`controller.store`, proto Structs); the URLs, capability lists and
status words of the admin API are made here, at the surface, so another surface can show the same
records its own way. The shapes themselves are in :mod:`controller.models`.
"""

from __future__ import annotations

import msgspec
from quart import Response

from agentic_sandbox.proto import messages as m

from ..http.responses import json_response
from ..models import HostDaemon, InstanceView, OperationView, iso
from ..store import InstanceRecord, OperationRecord, TaskRecord

#: The contract's ``operation_status`` for each instance state.
OPERATION_STATUS = {
    "running": "ready",
    # Traffic wakes it (docs/sleep.md): ready to be asked, as far as a client can tell.
    "sleeping": "ready",
    "stopped": "stopped",
    "destroyed": "stopped",
    "provisioning": "not_ready",
    "starting": "not_ready",
    "stopping": "not_ready",
    "failed": "not_ready",
    "destroying": "not_ready",
}


def agent_card_url(base_url: str, instance_id: str) -> str:
    return f"{base_url.rstrip('/')}/agents/{instance_id}/.well-known/agent-card.json"


def provider_state(info: m.InstanceInfo) -> dict[str, object]:
    """hostd's runtime detail of the instance (host process, container or domain) and how it was
    made (``launched_from``: a warm pool, a fork, a checkpoint)."""
    detail = info.host or info.container or info.vm
    state: dict[str, object] = msgspec.to_builtins(detail) if detail is not None else {}
    if info.launched_from is not None:
        state["launched_from"] = info.launched_from
    if info.adopted is not None:
        state["adopted"] = info.adopted
    if info.sleeps or info.wakes:
        state.update(sleeps=info.sleeps, wakes=info.wakes, asleep_s=round(info.asleep_s, 3))
        if info.last_wake is not None:
            state["last_wake"] = msgspec.to_builtins(info.last_wake)
    return state


def instance_view(
    rec: InstanceRecord,
    base_url: str,
    *,
    hostd_available: bool,
    info: m.InstanceInfo | None = None,
    host_state: str | None = None,
) -> InstanceView:
    """``info`` (hostd's view, when it was asked) adds the image and the provider's own state.
    Capabilities are the provider's, as folded into the row at the last reconcile. ``hostd_available``
    is said of the instance's own host (its hostd, or its controllers for another host's)."""
    host = rec.runtime == "host"
    image = info.container.image if info is not None and info.container is not None else None
    return InstanceView(
        id=rec.id,
        name=rec.name,
        runtime=rec.runtime,
        state=rec.state,
        agent_card_url=agent_card_url(base_url, rec.id),
        created_at=iso(rec.created_at),
        provider=rec.provider,
        capabilities=list(rec.capabilities),
        loadout=rec.loadout,
        source=rec.source,
        cwd=rec.working_dir,
        operation_status=OPERATION_STATUS.get(rec.state, "unknown"),
        transport="uds" if host else None,
        transport_posture="local" if host else None,
        host_daemon=HostDaemon(status="available" if hostd_available else "unavailable", label="agentic-hostd")
        if host
        else None,
        labels=dict(rec.labels),
        image=image or rec.image_ref,
        image_ref=rec.image_ref,
        provider_state=provider_state(info) or None if info is not None else None,
        host_id=rec.host_id,
        host_state=host_state,
        sleep=sleep_view(rec.sleep) if rec.state == "sleeping" else None,
        idle=rec.idle,
    )


def sleep_view(sleep: dict[str, object] | None) -> dict[str, object] | None:
    """How a sleeping instance sleeps, as served (``since`` as an RFC 3339 time)."""
    if sleep is None:
        return None
    since = sleep.get("since")
    return {**sleep, "since": iso(since)} if isinstance(since, int | float) else dict(sleep)


def operation_path(op_id: str) -> str:
    return f"/api/v2/admin/operations/{op_id}"


def operation_view(op: OperationRecord) -> OperationView:
    return OperationView(
        id=op.id,
        kind=op.kind,
        state=op.state,
        created_at=iso(op.created_at),
        started_at=None if op.started_at is None else iso(op.started_at),
        completed_at=None if op.completed_at is None else iso(op.completed_at),
        result=op.result,
        error=op.error,
    )


class OperationList(msgspec.Struct, kw_only=True):
    """``GET /operations``: a page, newest first; ``next_page_token`` is "" on the last page."""

    items: list[OperationView]
    next_page_token: str


def accepted(op: OperationRecord, *, a2a_token: str | None = None) -> Response:
    """202 with the ``OperationStatus`` and its ``Location`` (a provision adds the instance's
    A2A bearer token, the one time it is shown)."""
    body: dict[str, object] = msgspec.to_builtins(operation_view(op))
    if a2a_token is not None:
        body["a2a_token"] = a2a_token
    return json_response(body, 202, {"Location": operation_path(op.id)})


# -- container images --------------------------------------------------------------------------


class ContainerImage(msgspec.Struct, kw_only=True, omit_defaults=True):
    """admin-api ``ContainerImage``."""

    name: str
    reference: str
    digest: str | None = None
    size_bytes: int | None = None
    labels: dict[str, str] = {}


class ImageList(msgspec.Struct, kw_only=True, omit_defaults=True):
    items: list[ContainerImage]
    degraded: bool = False
    reason: str | None = None


def image_list(listing: m.ImageListResponse) -> ImageList:
    return ImageList(
        items=[
            ContainerImage(
                name=image.name,
                reference=image.reference,
                digest=image.digest,
                size_bytes=image.size_bytes,
                labels=dict(image.labels),
            )
            for image in listing.images
        ],
        degraded=listing.degraded,
        reason=listing.reason,
    )


# -- PTY sessions --------------------------------------------------------------------------------

#: The pty-ws/v1 subprotocols, JSON first (what a client offers when it has no preference).
PTY_SUBPROTOCOLS = ["pty-ws.v1", "pty-ws.v1.binary"]


class SessionAttach(msgspec.Struct, kw_only=True):
    url: str
    subprotocols: list[str]


class SessionView(msgspec.Struct, kw_only=True):
    id: str
    instance_id: str
    argv: list[str]
    cwd: str
    #: running, exited, or pending (created with ``"start": false``; its first controller starts it)
    state: str
    cols: int
    rows: int
    created_at: str
    pid: int | None = None
    exited_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    end_reason: str | None = None
    #: The output sequences hostd still holds: [first_seq, next_seq); replay_from takes any of them - 1.
    first_seq: int
    next_seq: int
    attach: SessionAttach


class SessionList(msgspec.Struct, kw_only=True, omit_defaults=True):
    items: list[SessionView]
    #: Only on a paged answer (``limit`` given): the next page's ``page_token``, "" on the last page.
    next_page_token: str | None = None


def attach_url(base_url: str, instance_id: str, session_id: str) -> str:
    ws_base = "ws" + base_url.rstrip("/")[4:] if base_url.startswith("http") else base_url.rstrip("/")
    return f"{ws_base}/agents/{instance_id}/sessions/{session_id}/attach"


def session_path(instance_id: str, session_id: str) -> str:
    return f"/api/v2/admin/instances/{instance_id}/sessions/{session_id}"


#: What a session's ``state`` may be (also the list's ``state`` filter).
SESSION_STATES = ("pending", "running", "exited")


def session_state(info: m.SessionInfo) -> str:
    return "pending" if info.pending else info.state


def session_view(info: m.SessionInfo, base_url: str) -> SessionView:
    return SessionView(
        id=info.session_id,
        instance_id=info.instance_id,
        argv=list(info.argv),
        cwd=info.cwd,
        state=session_state(info),
        cols=info.cols,
        rows=info.rows,
        created_at=iso(info.created_at),
        pid=info.pid,
        exited_at=None if info.exited_at is None else iso(info.exited_at),
        exit_code=info.exit_code,
        signal=info.signal,
        end_reason=info.end_reason,
        first_seq=info.first_seq,
        next_seq=info.next_seq,
        attach=SessionAttach(
            url=attach_url(base_url, info.instance_id, info.session_id), subprotocols=list(PTY_SUBPROTOCOLS)
        ),
    )


# -- A2A tasks -----------------------------------------------------------------------------------


class TaskSummary(msgspec.Struct, kw_only=True):
    """A task as the admin list shows it: where it is and how it stands, not what it holds
    (the A2A surface serves the task itself)."""

    id: str
    instance_id: str
    context_id: str
    #: The A2A state name (``TASK_STATE_WORKING``, ...).
    state: str
    created_at: str
    #: When its status last changed (the list's order, newest first).
    updated_at: str


class TaskList(msgspec.Struct, kw_only=True):
    """``GET /tasks``: a page, and how many tasks match the filters in all."""

    items: list[TaskSummary]
    next_page_token: str
    total_size: int


def task_summary(rec: TaskRecord) -> TaskSummary:
    return TaskSummary(
        id=rec.id,
        instance_id=rec.instance_id,
        context_id=rec.context_id,
        state=rec.state,
        created_at=iso(rec.created_at),
        updated_at=iso(rec.status_at),
    )
