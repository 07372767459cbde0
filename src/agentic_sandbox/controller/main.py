"""``agentic-controller [--dev] [--config FILE]``: serve the controller with hypercorn's trio worker.

Start-up order: load and validate the configuration (exit 2 with the message on error), install the
process guard (from here on this process cannot create processes), build the app (opens the store,
resolves tokens), then serve on ``AIWG_LISTEN`` (TLS when a cert and key are configured), starting
the app's services (the gRPC server on ``AIWG_GRPC_LISTEN``: an address that cannot be bound is one
log line, and the controller stops and exits 1 before printing anything else). Once listening it
prints the URLs a newcomer needs; ``--dev`` also provisions (first start) or starts the
host instance ``dev`` as soon as hostd is reachable and prints its AgentCard URL.

SIGHUP: read the operator tokens file (``operator-tokens.toml``) again.

SIGINT/SIGTERM: stop accepting, give open requests ``GRACEFUL_TIMEOUT_S``, cancel background work,
close the store, exit 0. Instances keep running on hostd.

``agentic-controller migrate-store --from FILE --to URL``: copy a SQLite store into PostgreSQL
(:mod:`controller.store.migration`).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import ssl
import sys
from collections import Counter
from functools import partial

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from quart_trio import QuartTrio

from agentic_sandbox.proto import LogConfigError, configure_logging, logs_as_json

from .app import create_app, startup_failure
from .auth.mtls import record_client_certificates
from .auth.operatortokens import reload_operator_tokens
from .bindcheck import bind_error
from .config import ConfigError, ControllerConfig, advertised_url, load_config
from .guard import install_process_guard
from .pty.frames import MAX_CLIENT_FRAME_BYTES
from .pty.legacy import LegacyPort
from .state import AppState, state_of
from .store import SchemaTooNew, StoreUnavailable
from .store.migration import main as migrate_store

log = logging.getLogger("controller")

GRACEFUL_TIMEOUT_S = 3.0
DEV_INSTANCE = "dev"


class _ServerConfig(HypercornConfig):
    """hypercorn's settings, with client certificates asked for and recorded (mTLS) when configured."""

    client_auth: str = "none"
    client_ca: str | None = None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        context = super().create_ssl_context()
        if context is not None and self.client_auth != "none" and self.client_ca:
            record_client_certificates(context, self.client_auth, self.client_ca)
        return context


def hypercorn_config(config: ControllerConfig, *, graceful_timeout_s: float = GRACEFUL_TIMEOUT_S) -> _ServerConfig:
    """hypercorn's settings for ``config`` (the test fixtures serve the app with the same)."""
    hc = _ServerConfig()
    hc.bind = [config.listen]
    if config.tls_cert and config.tls_key:
        hc.certfile = config.tls_cert
        hc.keyfile = config.tls_key
        hc.client_auth = config.tls_client_auth
        hc.client_ca = config.tls_client_ca
    hc.graceful_timeout = graceful_timeout_s
    hc.keep_alive_timeout = config.keep_alive_timeout_s
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.include_server_header = False
    # PTY attach sockets: a protocol-level ping keeps proxies from cutting idle terminals; frames
    # above the binding's own bound (controller.pty.frames) are refused by the socket with an Error
    # frame, so hypercorn's limit (close 1009) only stops what is far beyond it.
    hc.websocket_ping_interval = config.pty_ping_interval_s
    hc.websocket_max_message_size = 4 * MAX_CLIENT_FRAME_BYTES
    return hc


def _say(line: str) -> None:
    """Tell a newcomer something; with JSON logs it is a log line, so every output line is JSON."""
    if logs_as_json():
        log.info("%s", line)
    else:
        print(line, flush=True)


async def _dev_instance(state: AppState, base: str) -> None:
    """Make sure the ``dev`` host instance exists and runs, then print its AgentCard URL."""
    await state.link.wait_ready()
    rec = await state.instances.ensure_dev_instance(DEV_INSTANCE)
    if rec is None:
        _say(f"dev instance: could not be provisioned (see the log); retry with POST {base}/api/v2/admin/instances")
        return
    _say(f"dev instance:  {rec.name} {rec.id} ({rec.state})")
    _say(f"  AgentCard:   {base}/agents/{rec.id}/.well-known/agent-card.json")


async def _wait_for_signal(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            stop.set()
            return


async def _reload_on_sighup(state: AppState) -> None:
    """SIGHUP: read the operator tokens file again (a removed token stops working at once, an added
    one starts); a file that is wrong changes nothing and says why."""
    path, store = state.config.operator_tokens_file, state.store
    if store is None:
        return
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            try:
                tokens = await reload_operator_tokens(path, store.tokens, state.auth)
            except ConfigError as exc:
                log.error("SIGHUP: kept the tokens in use: %s", exc)
                continue
            roles = Counter(t.role for t in tokens)
            log.info(
                "SIGHUP: operator tokens reloaded from %s: %d admin, %d operator",
                path or "(no AIWG_OPERATOR_TOKENS_FILE)",
                roles["admin"],
                roles["operator"],
            )


async def serve_legacy_pty(
    app: QuartTrio, config: ControllerConfig, stop: trio.Event, task_status: trio.TaskStatus[list[str]]
) -> None:
    """The legacy v1 PTY WebSocket on its own listener (the app behind :class:`LegacyPort`)."""
    hc = hypercorn_config(config)
    hc.bind = [config.legacy_pty_listen or ""]
    hc.certfile = hc.keyfile = None  # upstream's v1 port is plain ws://
    hc.client_auth = "none"
    await serve(LegacyPort(app), hc, shutdown_trigger=stop.wait, task_status=task_status)  # type: ignore[arg-type]


async def serve_app(app: QuartTrio, config: ControllerConfig) -> int:
    """Serve until SIGINT/SIGTERM; the exit status. 1 when the app could not start all it serves
    (a gRPC address already in use): logged by the app, then stopped as on SIGTERM before anything
    says it listens."""
    state = state_of(app)
    for setting, listen in (("AIWG_LISTEN", config.listen), ("AIWG_LEGACY_PTY_LISTEN", config.legacy_pty_listen)):
        # Before the app starts anything: hypercorn would raise from inside its lifespan.
        reason = bind_error(listen) if listen else None
        if reason is not None:
            log.error("cannot listen on %s: %s (%s)", listen, reason, setting)
            return 1
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_wait_for_signal, stop)
        nursery.start_soon(_reload_on_sighup, state)

        async def serve_then_stop(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
            await serve(app, hypercorn_config(config), shutdown_trigger=stop.wait, task_status=task_status)
            nursery.cancel_scope.cancel()

        binds: list[str] = await nursery.start(serve_then_stop)  # the app's startup has run by now
        if startup_failure(app) is not None:
            stop.set()
            return 1
        base = config.public_url or binds[0]
        state.hosts.listening_at(advertised_url(config, binds[0]))  # the port bound, if AIWG_LISTEN said 0
        _say(f"agentic-controller listening on {binds[0]}")
        if config.legacy_pty_listen:
            legacy = await nursery.start(serve_legacy_pty, app, config, stop)
            _say(f"  legacy v1 PTY WebSocket: {legacy[0].replace('http', 'ws', 1)}/sessions/<id>")
        if state.a2a.grpc_port is not None:
            host = config.grpc_listen.rsplit(":", 1)[0] if config.grpc_listen else ""
            _say(f"  A2A gRPC:    {host}:{state.a2a.grpc_port}  (tenant: the instance id)")
        _say(f"  admin API:   {base}/api/v2/admin/instances  (Authorization: Bearer <token>)")
        _say(f"  web console: {base}/console/  (sign in with a token)")
        if config.admin_token is None and os.path.exists(config.admin_token_file):
            _say(f"  admin token: {config.admin_token_file}")
        if config.operator_tokens_file and os.path.exists(config.operator_tokens_file):
            _say(f"  operator tokens: {config.operator_tokens_file} (reloaded on SIGHUP)")
        _say(f"  metrics:     {base}/metrics   readiness: {base}/readyz")
        if config.dev:
            nursery.start_soon(_dev_instance, state, base)
    return 0


def arg_parser() -> argparse.ArgumentParser:
    """``agentic-controller``'s flags (docs/configuration.md lists them from here)."""
    parser = argparse.ArgumentParser(prog="agentic-controller", description=__doc__.splitlines()[0])
    parser.add_argument("--dev", action="store_true", help="development defaults (state in ./.run, dev instance)")
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file (AIWG_* variables override it)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["migrate-store"]:  # a command of its own, before the server's flags are parsed
        return migrate_store(argv[1:])
    args = arg_parser().parse_args(argv)
    try:
        configure_logging()  # first: loading the configuration may log
        config = load_config(args.config, dev=args.dev)
        install_process_guard()
        app = create_app(config)
    except (ConfigError, LogConfigError) as exc:
        print(f"agentic-controller: configuration error: {exc}", file=sys.stderr)
        return 2
    except SchemaTooNew as exc:
        print(f"agentic-controller: {exc}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:
        print(f"agentic-controller: {exc.message} (AIWG_DATABASE_URL)", file=sys.stderr)
        return 1
    return trio.run(partial(serve_app, app, config))


if __name__ == "__main__":
    sys.exit(main())
