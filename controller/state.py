"""Per-app state: one typed object on ``app.extensions["aiwg"]`` (no module-level mutable state).

``create_app`` builds it; route modules reach it with :func:`app_state`. D2's services sit beside it
as ``app.extensions["storage"]``, ``["loadouts"]``, ``["images"]``, the authenticator as ``["auth"]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quart import current_app

from .auth import Authenticator
from .config import ControllerConfig
from .hostlink import HostdLink
from .instances import InstanceService
from .metrics import Metrics
from .operations import OperationService
from .store import Store


@dataclass
class AppState:
    config: ControllerConfig
    store: Store
    metrics: Metrics
    link: HostdLink
    operations: OperationService
    instances: InstanceService
    auth: Authenticator
    openapi: dict[str, Any] | None = field(default=None)


def app_state() -> AppState:
    return current_app.extensions["aiwg"]
