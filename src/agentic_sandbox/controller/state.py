"""Per-app state: one typed object holding every service, on ``app.extensions["aiwg"]``.

``create_app`` builds it; route modules reach it with :func:`app_state`. It is the only entry the
controller keeps in ``app.extensions`` (no module-level mutable state, no per-service string keys).
The service types are imported for type checking only: the service modules import nothing from the
HTTP layer, and this module must not pull them (and their imports) in ahead of ``create_app``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quart import current_app

if TYPE_CHECKING:
    from quart import Quart

    from .a2a.idempotencycache import IdempotencyCache
    from .a2a.service import A2AService
    from .auth.credentials import InstanceCredentials
    from .auth.tokens import Authenticator
    from .config import ControllerConfig
    from .console.assets import ConsoleAssets
    from .events.bus import EventBus
    from .events.logs import LogRing
    from .fleet.service import FleetService
    from .hostlink import HostdLink
    from .hosts.registry import HostRegistry
    from .instances.activity import ActivityReport
    from .instances.checkpoints import CheckpointService
    from .instances.images import ImageService
    from .instances.pools import WarmPoolService
    from .instances.runtimes import RuntimeService
    from .instances.service import InstanceService
    from .instances.sessions import SessionService
    from .instances.watch import HostdWatch
    from .loadouts.service import LoadoutService
    from .metrics import Metrics
    from .operations import OperationService
    from .pty.rooms import Rooms
    from .push import PushService
    from .storage import StorageService
    from .store import Store
    from .tasks import TaskService

EXTENSION_KEY = "aiwg"


@dataclass
class AppState:
    config: ControllerConfig
    metrics: Metrics
    link: HostdLink
    auth: Authenticator
    credentials: InstanceCredentials
    operations: OperationService
    instances: InstanceService
    pools: WarmPoolService
    loadouts: LoadoutService
    storage: StorageService
    images: ImageService
    checkpoints: CheckpointService
    runtimes: RuntimeService
    events: EventBus
    logs: LogRing
    watch: HostdWatch
    sessions: SessionService
    rooms: Rooms
    tasks: TaskService
    push: PushService
    a2a: A2AService
    idempotency: IdempotencyCache
    #: This host among the hosts of a shared store (placement, routing, the admin hosts views).
    hosts: HostRegistry
    #: What keeps instances awake that hostd cannot see (docs/sleep.md).
    activity: ActivityReport
    #: fleet-workload/v1 records (docs/fleet.md).
    fleet: FleetService
    #: The store itself, for what asks the database directly (readiness).
    store: Store | None = field(default=None)
    openapi: dict[str, Any] | None = field(default=None)
    #: The web console's built files (``controller.console``); None until ``create_app`` loads them.
    console: ConsoleAssets | None = field(default=None)
    #: Open SSE followers per stream ("events", "logs"), bounded by ``max_stream_followers``.
    followers: dict[str, int] = field(default_factory=dict)


def state_of(app: Quart) -> AppState:
    state: AppState = app.extensions[EXTENSION_KEY]
    return state


def app_state() -> AppState:
    """The state of the app serving the current request (or app context)."""
    return state_of(current_app)
