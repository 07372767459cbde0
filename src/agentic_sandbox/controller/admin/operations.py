"""Admin operations: ``GET /operations`` (a page, newest first) and ``GET /operations/{id}`` (404
once purged or never made).

The list takes ``state``, ``kind`` and ``instance_id`` filters, ``limit`` (default
:data:`~.paging.DEFAULT_PAGE_SIZE`) and ``page_token`` (see :mod:`.paging`); it shows what
``GET /operations/{id}`` would (ended operations while they are kept). An instance's own A2A token
sees only the operations on its instance.
"""

from __future__ import annotations

from quart import Response, g, request

from ..auth.tokens import READ
from ..http.responses import json_response
from ..http.roles import require_role
from ..state import app_state
from .blueprint import admin
from .paging import DEFAULT_PAGE_SIZE, decode_token, encode_token, narrowed_to, page_size
from .views import OperationList, operation_view


@admin.get("/operations")
@require_role(*READ, own_instance=True)
async def list_operations() -> Response:
    args = request.args
    filters = {"state": args.get("state"), "kind": args.get("kind"), "instance_id": args.get("instance_id")}
    limit = page_size(args.get("limit"), default=DEFAULT_PAGE_SIZE)
    after = decode_token(args.get("page_token"), "operations", filters)
    own = narrowed_to(g.principal)
    if own is not None and filters["instance_id"] not in (None, own):
        return json_response(OperationList(items=[], next_page_token=""))  # another instance's: none to see
    ops, more = await app_state().operations.page(
        state=filters["state"],
        kind=filters["kind"],
        instance_id=own or filters["instance_id"],
        after=after,
        limit=limit,
    )
    token = encode_token("operations", filters, (ops[-1].created_at, ops[-1].id)) if more else ""
    return json_response(OperationList(items=[operation_view(op) for op in ops], next_page_token=token))


@admin.get("/operations/<op_id>")
@require_role(*READ)
async def get_operation(op_id: str) -> Response:
    return json_response(operation_view(await app_state().operations.require(op_id)))
