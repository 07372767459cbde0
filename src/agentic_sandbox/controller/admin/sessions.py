"""Admin PTY session routes: ``/api/v2/admin/instances/{id}/sessions[/{sid}]``.

``POST`` starts a process on a PTY in the instance (argv, cwd, env, size) and answers 201 with the
session, its ``Location`` and how to attach (the pty-ws/v1 URL and subprotocols); with ``"start":
false`` nothing starts yet: the session is ``pending`` until the first controller joins it over the
attach socket, whose ``pty.join_session`` launch fields then replace these
(:mod:`controller.pty.launch`). ``GET`` lists or reads; ``DELETE`` kills the session's process tree
and forgets it (204). Starting and deleting a session needs the operator or admin role (a shell
in the instance is control of it); reading needs any token. An instance's own A2A token may do all
four in its own instance (it drives that instance's shells over the attach socket already);
another instance is a 404 to it.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from quart import Response, request

from agentic_sandbox.proto import messages as m

from ..auth.tokens import OPERATE, READ
from ..decoding import decode_json
from ..errors import ValidationFailed
from ..http.responses import base_url, json_response, request_body
from ..http.roles import require_role
from ..instances.sessions import DEFAULT_COLS, DEFAULT_ROWS
from ..state import app_state
from ..values import Cwd
from .blueprint import admin
from .paging import DEFAULT_PAGE_SIZE, decode_token, encode_token, page_size
from .views import SESSION_STATES, SessionList, session_path, session_state, session_view

Dim = Annotated[int, msgspec.Meta(ge=1, le=m.MAX_TERMINAL_DIM)]


class TerminalSize(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    cols: Dim = DEFAULT_COLS
    rows: Dim = DEFAULT_ROWS


class SessionCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What ``POST .../sessions`` takes; every field is optional (``bash -l`` at 120x30, started now)."""

    argv: m.Argv | None = None
    cwd: Cwd | None = None
    env: m.Env = {}
    size: TerminalSize = TerminalSize()
    #: False: hold the session pending; the first controller to join starts it.
    start: bool = True


@admin.post("/instances/<instance_id>/sessions")
@require_role(*OPERATE, own_instance=True)
async def create_session(instance_id: str) -> Response:
    body = await request_body()
    req = decode_json(body or b"{}", SessionCreate)
    info = await app_state().sessions.create(
        instance_id,
        argv=req.argv,
        cwd=req.cwd,
        env=req.env,
        cols=req.size.cols,
        rows=req.size.rows,
        start=req.start,
    )
    return json_response(session_view(info, base_url()), 201, {"Location": session_path(instance_id, info.session_id)})


@admin.get("/instances/<instance_id>/sessions")
@require_role(*READ, own_instance=True)
async def list_sessions(instance_id: str) -> Response:
    """Without ``limit`` (and ``page_token``) every session, in hostd's order, as before; with it
    a page, oldest first (``created_at``, then id), and ``next_page_token`` (see :mod:`.paging`).
    hostd answers the whole list (it holds a bounded number of sessions); the page is cut here."""
    args = request.args
    wanted = args.get("state")
    if wanted is not None and wanted not in SESSION_STATES:
        message = f"must be one of {', '.join(SESSION_STATES)}"
        raise ValidationFailed([{"field": "state", "message": message, "code": "enum"}])
    filters = {"instance_id": instance_id, "state": wanted}
    limit = page_size(args.get("limit"), default=DEFAULT_PAGE_SIZE if args.get("page_token") else None)
    after = decode_token(args.get("page_token"), "sessions", filters) if limit else None
    infos = [info for info in await app_state().sessions.list(instance_id) if wanted in (None, session_state(info))]
    base = base_url()
    if limit is None:
        return json_response(SessionList(items=[session_view(info, base) for info in infos]))
    infos = sorted((info for info in infos if after is None or _key(info) > after), key=_key)
    token = encode_token("sessions", filters, _key(infos[limit - 1])) if len(infos) > limit else ""
    return json_response(SessionList(items=[session_view(info, base) for info in infos[:limit]], next_page_token=token))


def _key(info: m.SessionInfo) -> tuple[float, str]:
    return (info.created_at, info.session_id)


@admin.get("/instances/<instance_id>/sessions/<session_id>")
@require_role(*READ, own_instance=True)
async def get_session(instance_id: str, session_id: str) -> Response:
    return json_response(session_view(await app_state().sessions.get(instance_id, session_id), base_url()))


@admin.delete("/instances/<instance_id>/sessions/<session_id>")
@require_role(*OPERATE, own_instance=True)
async def delete_session(instance_id: str, session_id: str) -> Response:
    await app_state().sessions.delete(instance_id, session_id)
    return Response(b"", status=204)
