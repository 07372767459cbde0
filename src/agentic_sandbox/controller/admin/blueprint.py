"""The admin surface's blueprint, with its problem+json error handlers; route modules register on it."""

from __future__ import annotations

from quart import Blueprint

from ..http.problems import install_problem_handlers

admin = Blueprint("admin", __name__, url_prefix="/api/v2/admin")
install_problem_handlers(admin)
