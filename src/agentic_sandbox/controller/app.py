"""``create_app(config)``: the quart-trio app with its three surfaces and per-app state.

Blueprints: ``observability`` (``/healthz``, ``/readyz``, ``/metrics``, OpenAPI), ``admin``
(``/api/v2/admin``), ``v1`` (``/api/v1``, answering through the admin views), ``a2a`` and ``pty``
(under ``/agents/{id}``) and ``console`` (``/console/``, the web console's static files); the
surfaces never share a prefix.

Resource handling: ``create_app`` opens the store (the SQLite file, or PostgreSQL at
``AIWG_DATABASE_URL``) and resolves the tokens (so configuration errors surface before serving).
Background services live in the app's nursery (quart-trio's ``app.nursery``, which exists while the
app is served): the store's WAL checkpoints (SQLite, :mod:`controller.store.wal`) or the other
controllers' news (PostgreSQL, :mod:`controller.cluster`), the task leases, the hostd link, the
operation purge timer, the hostd watch (instance exits and sessions,
:mod:`controller.instances.watch`), the A2A gRPC server when ``AIWG_GRPC_LISTEN`` is set
(:mod:`controller.a2a.grpcbinding`) and every operation's work. A gRPC address that cannot be
bound is logged in one line and left for the server to act on (:func:`startup_failure`).
The event bus and the log ring are attached to the run while serving, and the log ring's handler
sits on the root logger only then. ``after_serving`` closes the store; at shutdown the nursery is cancelled at
once (``BACKGROUND_TASK_SHUTDOWN_TIMEOUT = None``): operations are durable and a restart marks the
interrupted ones failed.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import trio
from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from agentic_sandbox.proto import bind_log_ids, new_id

from .a2a.grpcbinding import serve_grpc
from .a2a.idempotencycache import IdempotencyCache
from .a2a.service import A2AService
from .admin.views import operation_path
from .auth.credentials import InstanceCredentials
from .auth.operatortokens import SOURCE as OPERATOR_TOKENS
from .auth.operatortokens import read_operator_tokens
from .auth.tokens import ROLE_ADMIN, Authenticator, config_tokens, resolve_admin_token
from .cluster import Cluster
from .config import ControllerConfig, advertised_url
from .console import install_console
from .console.assets import ConsoleAssets, describe
from .errors import ControllerError
from .events.bus import EventBus
from .events.logs import LogRing
from .fleet.service import FleetService
from .hostlink import HostdLink
from .hosts.forward import Forwarder
from .hosts.registry import HostRegistry
from .hosts.router import REFUSAL, Router
from .http.certgate import CertificateGate
from .http.connection import HTTPConnection
from .http.edge import install_http_edge
from .http.problems import error_body, from_http_exception, problem_response, trace_id
from .http.responses import BODY_READ
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
from .models import Runtime
from .operations import OperationService
from .pty.rooms import Rooms
from .pty.route import WebsocketConnection
from .push import PushService
from .state import EXTENSION_KEY, AppState
from .storage import StorageService
from .store import SqliteDatabase, Store
from .store.wal import run_checkpoints
from .tasks import TaskService
from .tasks.agentevents import AgentLimits
from .tasks.agentlogs import TaskLogs
from .tasks.files import TaskFiles

log = logging.getLogger(__name__)

#: ``app.extensions`` key of what kept the app from starting all it serves (see startup_failure).
STARTUP_FAILURE = "agentic_sandbox.controller.startup_failure"
API_PREFIX = "/api/"
#: The first instance conformance mode registers (upstream's fixed ids), on the echo loadout.
CONFORMANCE_NAME = "conformance"
A2A_PREFIX = "/agents/"
#: Methods that get their own metric label; any other token (clients may send anything) is "other".
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


#: The conformance fleet's runtimes, in upstream's order, with the built-in loadout of each.
CONFORMANCE_RUNTIMES: tuple[tuple[Runtime, str], ...] = (("host", "echo"), ("docker", "busybox"), ("qemu", "tiny-vm"))


def conformance_member(index: int) -> tuple[str, str, Runtime, str]:
    """Upstream's conformance instance ``index`` (from 0): its id, name, runtime and loadout."""
    runtime, loadout = CONFORMANCE_RUNTIMES[index % len(CONFORMANCE_RUNTIMES)]
    name = CONFORMANCE_NAME if index == 0 else f"{CONFORMANCE_NAME}-{index + 1}"
    return f"00000000-0000-7000-8000-{index + 1:012d}", name, runtime, loadout


def _surface(blueprint: str | None, path: str) -> str:
    if blueprint in ("admin", "fleet", "v1", "observability", "a2a", "console"):
        return blueprint
    if path.startswith("/api/v1/"):
        return "v1"
    if path.startswith("/api/v2/admin/"):
        return "admin"
    if path.startswith("/agents/"):
        return "a2a"
    return "other"


def startup_failure(app: QuartTrio) -> str | None:
    """Why the app could not start all it serves (its gRPC listener), once its startup has run;
    None when it did. Logged already (one line, no traceback). Not raised by the startup hook: quart
    would log it again with a traceback, and hypercorn would go on to listen; its server (``main``)
    asks once hypercorn has started, stops the app and exits non-zero."""
    failure: str | None = app.extensions.get(STARTUP_FAILURE)
    return failure


def open_store(config: ControllerConfig) -> Store:
    """The SQLite file in the state dir, or PostgreSQL at ``AIWG_DATABASE_URL`` (``StoreUnavailable``
    when it does not answer within ``AIWG_DATABASE_TIMEOUT_S``)."""
    if config.database_url is None:
        return Store.open(config.database_path)
    return Store.connect(
        config.database_url,
        min_size=config.database_pool_min,
        max_size=config.database_pool_max,
        timeout_s=config.database_timeout_s,
    )


def create_app(config: ControllerConfig) -> QuartTrio:
    app = QuartTrio(__name__, static_folder=None)
    # Closes connections that must close and starts the keep-alive timer (see its module).
    app.asgi_http_class = HTTPConnection
    app.asgi_websocket_class = WebsocketConnection  # the attach socket, served on ASGI
    app.config["MAX_CONTENT_LENGTH"] = config.max_request_bytes
    app.config["BACKGROUND_TASK_SHUTDOWN_TIMEOUT"] = None

    metrics = Metrics()
    #: This process among the controllers of a shared store (its claims on tasks are in its name).
    controller_id = new_id()
    store = open_store(config)
    log.info("controller %s: store is %s", controller_id, store.db.describe())
    events = EventBus(config.event_ring_size, store=store)
    file_tokens = read_operator_tokens(config.operator_tokens_file)  # upstream's operator-tokens.toml
    admin_token = resolve_admin_token(config, file_has_admin=any(t.role == ROLE_ADMIN for t in file_tokens))
    store.tokens.replace("config", config_tokens(config, admin_token))
    store.tokens.replace(OPERATOR_TOKENS, file_tokens)
    # The log ring never shows a configured token, whatever a line says.
    logs = LogRing(config.log_ring_size, secrets=[admin_token or "", config.operator_token or ""])
    auth = Authenticator(
        store.tokens.list(),
        store.credentials.token_digests(),
        certificate_admins=frozenset(config.mtls_admin_allowlist),
    )
    credentials = InstanceCredentials(store, auth)
    link = HostdLink(
        config.hostd_socket,
        call_timeout_s=config.hostd_call_timeout_s,
        connect_timeout_s=config.hostd_connect_timeout_s,
        ping_interval_s=config.hostd_ping_interval_s,
        reconnect_max_s=config.hostd_reconnect_max_s,
        metrics=metrics,
    )
    operations = OperationService(
        store,
        metrics,
        events,
        retention_s=config.operation_retention_s,
        # An operation's stored error is the admin envelope, its ``instance`` the operation's URL.
        error_body=lambda exc, op_id: error_body(exc, operation_path(op_id)),
        owner=controller_id,
        lease_ttl_s=config.lease_ttl_s,
    )
    hosts = HostRegistry(
        store,
        link,
        controller_id=controller_id,
        url=advertised_url(config) if not config.listen.endswith(":0") else None,  # else once it bound
        labels=config.host_labels,
        heartbeat_s=config.host_heartbeat_s,
        timeout_s=config.host_timeout_s,
        max_instances=config.host_max_instances,
    )
    loadouts = LoadoutService(Path(config.loadouts_dir))
    pools = WarmPoolService(link, operations, loadouts, config.warm_pools)
    pools.check_config()
    instances = InstanceService(
        store,
        link,
        operations,
        loadouts=loadouts,
        events=events,
        credentials=credentials,
        pools=pools,
        metrics=metrics,
    )
    link.on_connected.append(instances.reconcile)
    link.on_connected.append(pools.sync)
    watch = HostdWatch(
        link,
        instances,
        events,
        interval_s=config.watch_interval_s,
        store=store,
        owner=controller_id,
        lease_ttl_s=config.lease_ttl_s,
    )
    tasks = TaskService(
        store,
        link,
        loadouts,
        events,
        files=TaskFiles(Path(config.state_dir) / "task-files"),
        logs=TaskLogs(Path(config.state_dir) / "task-logs", config.agent_log_bytes),
        retention_s=config.task_retention_s,
        keep_per_instance=config.task_retention_per_instance,
        metrics=metrics,
        agent_limits=AgentLimits(events_per_s=config.agent_events_per_s, max_file_bytes=config.agent_max_file_bytes),
        agent_cancel_grace_s=config.agent_cancel_grace_s,
        owner=controller_id,
        lease_ttl_s=config.lease_ttl_s,
        hosts=hosts,
    )
    cluster = None
    if config.database_url is not None:
        cluster = Cluster(
            config.database_url,
            tasks=tasks,
            events=events,
            credentials=credentials,
            poll_s=config.notify_poll_s,
            connect_timeout_s=config.database_timeout_s,
        )
    push = PushService(store, tasks.hub, config, metrics.registry, owner=controller_id, lease_ttl_s=config.lease_ttl_s)
    idempotency = IdempotencyCache(
        store,
        metrics,
        ttl_s=config.idempotency_ttl_s,
        max_entries=config.idempotency_max_entries,
        owner=controller_id,
        lease_ttl_s=config.lease_ttl_s,
    )
    a2a_service = A2AService(
        store,
        tasks,
        push,
        credentials,
        loadouts,
        idempotency,
        keepalive_s=config.sse_keepalive_s,
        push_allow_private=config.push_allow_private,
    )

    activity = ActivityReport(link, parked=tasks.parked_execs, pushing=push.delivery.behind)
    app.extensions[EXTENSION_KEY] = AppState(
        config=config,
        metrics=metrics,
        link=link,
        auth=auth,
        credentials=credentials,
        operations=operations,
        instances=instances,
        pools=pools,
        loadouts=loadouts,
        storage=StorageService(Path(config.storage_dir), events, max_object_bytes=config.max_request_bytes),
        images=ImageService(link),
        checkpoints=CheckpointService(store, link, operations),
        runtimes=RuntimeService(link),
        events=events,
        logs=logs,
        watch=watch,
        sessions=SessionService(instances, link, hosts=hosts),
        rooms=Rooms(link),
        tasks=tasks,
        push=push,
        a2a=a2a_service,
        idempotency=idempotency,
        hosts=hosts,
        activity=activity,
        fleet=FleetService(store, events),
        store=store,
        console=ConsoleAssets.load(),
    )

    from .a2a.surface import a2a, error_response
    from .a2a.surface import from_http_exception as a2a_http_error
    from .admin import admin
    from .fleet.routes import fleet
    from .observability import observability
    from .pty.surface import pty
    from .v1 import v1

    app.register_blueprint(observability)
    app.register_blueprint(admin)
    app.register_blueprint(fleet)
    app.register_blueprint(v1)
    app.register_blueprint(pty)
    app.register_blueprint(a2a)
    install_console(app)
    # In front of every surface: a request about another host's instance goes to that host.
    forwarder = Forwarder(connect_timeout_s=config.hostd_connect_timeout_s)
    router = Router(
        app.asgi_app,  # type: ignore[arg-type]
        registry=hosts,
        store=store,
        auth=auth,
        forwarder=forwarder,
        public_url=config.public_url,
        max_body_bytes=config.max_request_bytes,
    )
    app.asgi_app = router  # type: ignore[assignment]
    if config.tls_client_auth != "none":  # outermost: a refused certificate goes no further
        app.asgi_app = CertificateGate(router, frozenset(config.mtls_admin_allowlist))  # type: ignore[assignment]

    @app.before_serving
    async def _start_services() -> None:
        console: ConsoleAssets = app.extensions[EXTENSION_KEY].console
        log.log(logging.WARNING if console.missing else logging.INFO, "%s", describe(console))
        events.ring.attach()
        logs.ring.attach()
        logs.install()
        if isinstance(store.db, SqliteDatabase):
            await app.nursery.start(run_checkpoints, store.db)  # keeps the fsyncs of checkpoints off the loop
        if cluster is not None:
            await app.nursery.start(cluster.run)  # what the other controllers write reaches this one
            await app.nursery.start(events.run)
        operations.attach(app.nursery)
        app.extensions[EXTENSION_KEY].rooms.attach(app.nursery)
        await operations.recover()
        if store.shared:
            await router.start()  # the cluster's secret: requests for other hosts are forwarded
        await app.nursery.start(link.run)
        await app.nursery.start(hosts.run)  # this host and controller in the store, and the others
        await app.nursery.start(operations.run_purger)
        if store.shared:
            await app.nursery.start(operations.run_sweeps)
        await app.nursery.start(watch.run)
        await app.nursery.start(activity.run)
        tasks.attach(app.nursery)
        await tasks.recover()
        await app.nursery.start(tasks.run_leases)
        await app.nursery.start(tasks.run_purger)
        push.delivery.attach(app.nursery)
        await push.delivery.recover()
        await app.nursery.start(push.delivery.run_sweeps)  # a shared store: configs whose controller died
        if config.grpc_listen:  # the A2A gRPC binding; its cards list it once it listens
            try:
                a2a_service.grpc_port = await app.nursery.start(serve_grpc, app)
            except OSError as exc:  # the port is taken, the address is not this host's
                log.error("%s (AIWG_GRPC_LISTEN)", exc)
                app.extensions[STARTUP_FAILURE] = str(exc)
                return
        if config.conformance_mode:
            app.nursery.start_soon(_conformance_instance)

    async def _conformance_instance() -> None:
        # Upstream's conformance mode: pre-registered instances with fixed ids, their runtimes
        # cycling host, container, VM; each is provisioned (first start) or started on its own.
        await link.wait_ready()
        async with trio.open_nursery() as nursery:
            for index in range(config.conformance_fleet_size):
                nursery.start_soon(_conformance_member, index)

    async def _conformance_member(index: int) -> None:
        instance_id, name, runtime, loadout = conformance_member(index)
        try:
            rec = await instances.ensure_dev_instance(name, instance_id=instance_id, runtime=runtime, loadout=loadout)
        except ControllerError as exc:  # e.g. no VM runtime on this host: the others go on
            log.error("conformance mode: instance %s (%s, %s) not provisioned: %s", instance_id, name, runtime, exc)
            return
        shown = rec.state if rec else "missing"
        log.info("conformance mode: instance %s (%s, %s) is %s", instance_id, name, runtime, shown)

    @app.after_serving
    async def _close_store() -> None:
        await forwarder.aclose()
        if store.shared:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await hosts.leave()  # a clean stop: the other controllers stop forwarding here at once
        push.delivery.close()
        logs.uninstall()
        logs.ring.detach()
        events.ring.detach()
        store.close()

    @app.before_request
    async def _start_timer() -> None:
        g.started = time.perf_counter()
        # Every log line of this request (and of an operation it starts) names it: the trace id
        # problems carry, and the instance when the route names one. The request's task ends
        # with the request, so nothing needs resetting.
        bind_log_ids(request_id=trace_id(), instance_id=(request.view_args or {}).get("instance_id"))
        refusal = REFUSAL.get()
        if refusal is not None:  # the router could not serve it where it belongs (its host is away)
            raise refusal

    install_http_edge(app)  # after the timer: its OPTIONS answer is timed and counted too

    @app.after_request
    async def _observe(response: Response) -> Response:
        started = g.get("started")
        if started is not None:
            rule = request.url_rule.rule if request.url_rule is not None else "<unmatched>"
            metrics.observe_http(
                _surface(request.blueprint, request.path),
                request.method if request.method in HTTP_METHODS else "other",
                rule,
                response.status_code,
                time.perf_counter() - started,
            )
        return response

    @app.after_request
    async def _drain_body(response: Response) -> Response:
        # A request body the handler never read (a 405, a 401, a GET with a body) is read
        # before the response ends, so hypercorn can recycle the connection for the next
        # request instead of closing it (see controller.http.connection for the close itself).
        if g.get(BODY_READ):
            return response
        try:
            await request.get_data(cache=False)
        except HTTPException:
            # Over the size limit: the rest of the body stays unread and hypercorn closes the
            # connection after this response. Say so, so the client does not reuse it.
            response.headers["Connection"] = "close"
        return response

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Any:
        # Routing errors carry no blueprint: under /api/ they still answer problem+json.
        if request.path.startswith(API_PREFIX):
            return problem_response(from_http_exception(exc))
        if request.path.startswith(A2A_PREFIX):
            return error_response(a2a_http_error(exc))
        return exc

    return app
