"""The admin routes' role check: a route decorator over the app's :class:`Authenticator`.

Who may do what is drawn in :mod:`agentic_sandbox.controller.auth.tokens`; this module only applies
it to a request: 401 without a valid bearer token, 403 for a role that may not, 404 for an instance
token on another instance's route.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from quart import current_app, g, request

from ..auth.tokens import ROLE_INSTANCE
from ..errors import Forbidden, NotFound, Unauthenticated
from ..state import app_state


def require_role(*roles: str, own_instance: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Route decorator: 401 without a valid bearer token, 403 if its role is not in ``roles``.

    ``own_instance``: an instance token may use the route too, on its own instance: the route's
    ``instance_id`` must be the token's, else 404 ``instance.not_found`` (worded as for an instance
    that does not exist). A route without an ``instance_id`` (the instance list) narrows its answer
    to what :func:`may_use_instance` allows ``g.principal``.
    """

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(view)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            principal = app_state().auth.authenticate(request.headers.get("Authorization"))
            if principal is None:
                raise Unauthenticated("auth.unauthorized", "a valid bearer token is required")
            if own_instance and principal.role == ROLE_INSTANCE:
                named = kwargs.get("instance_id")
                if named is not None and named != principal.instance_id:
                    raise NotFound("instance.not_found", f"no instance with id {named!r}")
            elif principal.role not in roles:
                raise Forbidden("auth.forbidden", f"the {principal.role} role may not {request.method} {request.path}")
            g.principal = principal
            return await current_app.ensure_async(view)(*args, **kwargs)

        return wrapper

    return decorate
