"""``agentic-hostd``: start the host supervisor daemon.

Startup order matters to systemd and to clients: configuration is validated, state is loaded
and running instances re-adopted, the socket is bound, and only then READY=1 is sent. On
SIGTERM/SIGINT hostd says STOPPING=1, tells connected clients, ends every PTY session and exec
(they cannot be served by a hostd that is gone), persists instance state, leaves instance main
processes running for the next hostd to re-adopt, and removes its own socket.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import uuid
from pathlib import Path

import trio

from agentic_sandbox.proto import LogConfigError, configure_logging

from . import procspawn, sdnotify, statefile
from .config import ConfigError, HostdConfig, from_env
from .execs import ExecRegistry
from .handlers import HOSTD_VERSION, Handlers
from .instances import InstanceRegistry
from .listener import SocketInUse, bind_unix
from .pools import WarmPools
from .proctree import Cgroups
from .providers import make_providers
from .providers.podman.images import ImageCatalog
from .server import RpcServer
from .sessions import SessionRegistry
from .statefile import NewerStateFile

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


async def run_hostd(config: HostdConfig, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run hostd until SIGTERM/SIGINT or cancellation. Reports started once accepting."""
    state_dir = Path(config.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    config.instances_dir.mkdir(mode=0o700, exist_ok=True)
    cgroups = Cgroups.detect(config.cgroup_root)
    records = statefile.read(config.state_file)  # before any task starts: a refusal ends hostd plainly

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as registry_nursery:
            instances = InstanceRegistry(config)
            instances.use_providers(make_providers(config, cgroups, registry_nursery, instances.commit))
            await instances.load(records)
            pools = WarmPools(config, instances)
            await pools.load()
            await registry_nursery.start(pools.run)
            sessions = SessionRegistry(config, cgroups, registry_nursery, instances.placement)
            execs = ExecRegistry(config, cgroups, registry_nursery, instances.placement)
            instances.on_stop.append(sessions.kill_instance)
            instances.on_stop.append(execs.kill_instance)
            instances.count_children = lambda iid: (sessions.count(iid), execs.count(iid))

            server: RpcServer | None = None
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
            )
            server = RpcServer(config, handlers)
            bound = await bind_unix(config.socket_path, mode=config.socket_mode, group=config.socket_group or None)
            try:
                async with trio.open_nursery() as serve_nursery:
                    await serve_nursery.start(server.serve, bound)
                    await serve_nursery.start(sdnotify.run_watchdog)
                    log.info(
                        "hostd %s listening on %s (state %s, cgroups %s, %s instances)",
                        HOSTD_VERSION,
                        config.socket_path,
                        config.state_dir,
                        cgroups.root or "unavailable",
                        len(instances.list()),
                    )
                    sdnotify.ready(f"listening on {config.socket_path}")
                    task_status.started()
                    async for signum in signals:
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
    try:
        trio.run(run_hostd, config)
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
