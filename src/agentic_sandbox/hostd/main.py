"""``agentic-hostd``: start the host supervisor daemon.

Startup order matters to systemd and to clients: configuration is validated, state is loaded
and running instances re-adopted, the socket is bound, and only then READY=1 is sent. On
SIGTERM/SIGINT hostd says STOPPING=1, tells connected clients, ends every PTY session and exec
(they cannot be served by a hostd that is gone), persists instance state, leaves instance main
processes running for the next hostd to re-adopt, and removes its own socket.

SIGHUP (``systemctl reload``) upgrades hostd in place (:mod:`hostd.upgrade`): the same pid runs the
code now installed, with every session and exec handed over. An image started that way finds the
handover document through ``AIWG_HANDOVER_FD`` and takes over (:func:`take_over`) instead of binding
the socket; a document it cannot take over is refused before anything is touched, the trees it
named are killed (nobody could serve them) and hostd starts afresh.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import trio

from agentic_sandbox.proto import ErrorCode, LogConfigError, configure_logging
from agentic_sandbox.proto import messages as m

from . import handover, procspawn, proctree, sdnotify, statefile
from .config import ConfigError, HostdConfig, from_env
from .errors import RpcError
from .execs import ExecRegistry
from .fdstore import FdStore, Recovered, open_store
from .handlers import HOSTD_VERSION, Handlers
from .instances import InstanceRegistry
from .listener import BoundSocket, SocketInUse, bind_unix
from .pools import WarmPools
from .proctree import Cgroups
from .providers import make_providers
from .providers.podman.images import ImageCatalog
from .server import RpcServer
from .sessions import SessionRegistry
from .statefile import NewerStateFile
from .upgrade import CHECK_FLAG, Upgrader

log = logging.getLogger("hostd")

SHUTDOWN_DEADLINE_S = 20.0


def _host_id(state_dir: Path) -> str:
    """A stable id for this host, kept in the state dir."""
    path = state_dir / "host-id"
    try:
        value = path.read_text().strip()
        uuid.UUID(value)
        return value
    except (FileNotFoundError, ValueError):
        value = str(uuid.uuid4())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        return value


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


async def run_hostd(
    config: HostdConfig,
    document: handover.Document | None = None,
    store: tuple[FdStore, Recovered] | None = None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run hostd until SIGTERM/SIGINT or cancellation; SIGHUP upgrades it in place. Reports started
    once accepting. With ``document``, take over from the image that wrote it; with ``store``, keep
    sessions in the service manager's fd store and take back what a crashed hostd left there."""
    fdstore, recovered = store if store is not None else (FdStore({}, None), Recovered())
    state_dir = Path(config.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    config.instances_dir.mkdir(mode=0o700, exist_ok=True)
    cgroups = Cgroups.detect(config.cgroup_root)
    records = statefile.read(config.state_file)  # before any task starts: a refusal ends hostd plainly

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with trio.open_nursery() as registry_nursery:
            instances = InstanceRegistry(config)
            instances.use_providers(make_providers(config, cgroups, registry_nursery, instances.commit))
            await instances.load(records)
            pools = WarmPools(config, instances)
            await pools.load()
            await registry_nursery.start(pools.run)
            resuming = document is not None or bool(recovered.sessions)
            sessions = SessionRegistry(
                config, cgroups, registry_nursery, instances.placement, resuming=resuming, fdstore=fdstore
            )
            execs = ExecRegistry(config, cgroups, registry_nursery, instances.placement)
            instances.on_stop.append(sessions.kill_instance)
            instances.on_stop.append(execs.kill_instance)
            instances.count_children = lambda iid: (sessions.count(iid), execs.count(iid))
            instances.sleep.running_execs = execs.running_by_instance
            instances.sleep.attached_sessions = sessions.attached_by_instance
            instances.sleep.on_wake.append(execs.slept)
            execs.sleeping = instances.sleep.sleeping
            await registry_nursery.start(instances.sleep.run)
            if document is not None:
                sessions.resume(document.sessions)
                execs.resume(document.execs)
                bound = BoundSocket.adopt(document.listener_fd, document.socket_path, document.socket_ino)
            else:
                sessions.recover(recovered)
                bound = await bind_unix(config.socket_path, mode=config.socket_mode, group=config.socket_group or None)

            server: RpcServer | None = None
            upgrader: Upgrader | None = None

            async def upgrade() -> m.UpgradeResponse:
                assert upgrader is not None
                await upgrader.check()
                if not upgrader.ask(checked=True):
                    raise RpcError(ErrorCode.UPGRADE_REFUSED, "an upgrade is under way already")
                return m.UpgradeResponse(
                    pid=os.getpid(),
                    hostd_version=HOSTD_VERSION,
                    handover_version=handover.VERSION,
                    sessions=sessions.count(),
                    execs=execs.count(),
                )

            handlers = Handlers(
                config=config,
                cgroups=cgroups,
                instances=instances,
                pools=pools,
                sessions=sessions,
                execs=execs,
                images=ImageCatalog(config.podman_socket),
                host_id=_host_id(state_dir),
                boot_id=_boot_id(),
                connections=lambda: len(server.connections) if server else 0,
                upgrade=upgrade,
                started_at=document.started_at if document else None,
                upgrades=document.upgrades if document else 0,
            )
            server = RpcServer(config, handlers)
            upgrader = Upgrader(
                server=server,
                bound=bound,
                sessions=sessions,
                execs=execs,
                instances=instances,
                pools=pools,
                started_at=handlers.started_at,
                upgrades=handlers.upgrades,
                version=HOSTD_VERSION,
            )
            try:
                async with trio.open_nursery() as serve_nursery:
                    await serve_nursery.start(server.serve, bound)
                    await serve_nursery.start(sdnotify.run_watchdog)
                    await serve_nursery.start(upgrader.run)
                    log.info(
                        "hostd %s %s %s (state %s, cgroups %s, %s instances, %d sessions, %d execs)",
                        HOSTD_VERSION,
                        "took over" if document else "listening on",
                        config.socket_path,
                        config.state_dir,
                        cgroups.root or "unavailable",
                        len(instances.list()),
                        sessions.count(),
                        execs.count(),
                    )
                    if document is not None:
                        log.info(
                            "upgrade %d in place done: %.0f ms since the old image wrote its document",
                            document.upgrades,
                            (time.time() - document.written_at) * 1000,
                        )
                    sdnotify.ready(f"listening on {config.socket_path}")
                    task_status.started()
                    async for signum in signals:
                        if signum == signal.SIGHUP:
                            log.info("received SIGHUP: upgrading in place")
                            upgrader.ask(checked=False)
                            continue
                        log.info("received %s: shutting down", signal.Signals(signum).name)
                        break
                    sdnotify.stopping()
                    await server.announce_shutdown()
                    serve_nursery.cancel_scope.cancel()
            finally:
                bound.remove_own_file()
                with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_DEADLINE_S):
                    await sessions.shutdown()
                    await execs.shutdown()
                    await instances.shutdown()
                    pools.flush()
                registry_nursery.cancel_scope.cancel()
    log.info("hostd stopped")


def take_over(env: dict[str, str] | os._Environ[str], config: HostdConfig) -> handover.Document | None:
    """The handover document an earlier image left in ``AIWG_HANDOVER_FD``, or None (a plain start).

    A document this code cannot take over is refused before anything is touched: logged, the trees of
    the sessions and execs it named killed (their PTYs and pipes would have no reader) and the fds it
    passed closed, and hostd starts afresh.
    """
    try:
        fd = handover.take_fd(env)
        if fd is None:
            return None
        return handover.read(fd)
    except handover.HandoverRefused as exc:
        log.error("cannot take over from the previous image: %s; its sessions and execs are ended", exc)
        for kind in ("session", "exec"):
            proctree.kill_marked_with_prefix(config.tree_id(kind, ""))
        _close_inherited()
        return None


def _close_inherited() -> None:
    """Close every fd above stderr that is inheritable: what a handover passed (everything hostd
    opens itself is close-on-exec)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    os.close(fd)
            except OSError:
                continue


def check_handover(version: int, env: dict[str, str], *, dev: bool) -> int:
    """``--check-handover N``: exit 0 if this code (already imported whole, with every module hostd
    runs) reads its configuration and takes over a document of version N; else say why, exit 3."""
    try:
        from_env(env, dev=dev)
        handover.check_version(version)
    except (ConfigError, handover.HandoverRefused) as exc:
        print(f"agentic-hostd: {exc}", file=sys.stderr)
        return 3
    print(f"agentic-hostd {HOSTD_VERSION} takes over handover version {version}")
    return 0


def arg_parser() -> argparse.ArgumentParser:
    """``agentic-hostd``'s flags (docs/configuration.md lists them from here)."""
    parser = argparse.ArgumentParser(
        prog="agentic-hostd",
        description="Host supervisor daemon: owns every process tree and PTY session on this host.",
    )
    parser.add_argument(
        "--dev",
        action="store_true",
        help="development mode: state in ./.run (AIWG_STATE_DIR), socket ./.run/hostd.sock, no root needed",
    )
    parser.add_argument("--socket", help="RPC socket path (overrides AIWG_HOSTD_SOCKET)")
    parser.add_argument("--state-dir", help="state directory (overrides AIWG_STATE_DIR)")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR (default AIWG_LOG_LEVEL, else INFO)")
    parser.add_argument(
        CHECK_FLAG,
        type=int,
        metavar="VERSION",
        help="check that this code can take over a running hostd's handover document of VERSION, then exit "
        "(what an upgrade in place runs before it hands over)",
    )
    return parser


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    return arg_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    env = dict(os.environ)
    try:
        configure_logging(env, level=args.log_level)
    except LogConfigError as exc:
        print(f"agentic-hostd: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.socket:
        env["AIWG_HOSTD_SOCKET"] = args.socket
    if args.state_dir:
        env["AIWG_STATE_DIR"] = args.state_dir
    if args.check_handover is not None:
        return check_handover(args.check_handover, env, dev=args.dev)
    try:
        config = from_env(env, dev=args.dev)
    except ConfigError as exc:
        print(f"agentic-hostd: configuration error: {exc}", file=sys.stderr)
        return 2
    if not config.dev and os.geteuid() != 0:
        print(
            "agentic-hostd: must run as root to supervise instances (use --dev for an unprivileged development hostd)",
            file=sys.stderr,
        )
        return 2
    # Before any thread exists: the children hostd starts inherit the starting thread's mask.
    procspawn.unblock_signals()
    document = take_over(os.environ, config)
    if document is not None:
        if document.fd_store is not None:
            os.set_inheritable(document.fd_store, False)
        store = (FdStore(os.environ, document.fd_store), Recovered())
    else:
        store = open_store(os.environ, wanted=config.fd_store)
    try:
        trio.run(run_hostd, config, document, store)
    except (SocketInUse, NewerStateFile) as exc:
        print(f"agentic-hostd: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"agentic-hostd: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
