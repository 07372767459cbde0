"""``agentic-hostctl``: drive hostd from a shell (status, instances, PTY sessions, attach).

This module parses the command line, runs the simple commands and is the entry point
(``cli.hostctl:main``, also ``python -m cli.hostctl``). Every simple command opens one connection
with :func:`proto.open_hostd` (closed by :func:`_run` when the command returns), makes its
calls and exits; nothing is retried. ``attach`` is the exception: it keeps the terminal in raw
mode for as long as it runs and opens a new connection whenever one is lost (see
:mod:`cli.hostattach`). The socket is ``--socket``, else :func:`proto.find_hostd_socket`.

Error handling (:mod:`cli.output`): every ``HostdError`` becomes one line on stderr and
exit status 1; usage errors exit 2 (argparse's convention); nothing prints a traceback for an
expected failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

import trio

from agentic_sandbox.proto import (
    PROD_HOSTD_SOCKET,
    HostdClient,
    HostdRemoteError,
    HostdUnavailable,
    dev_hostd_socket,
    find_hostd_socket,
    new_id,
    open_hostd,
)
from agentic_sandbox.proto import messages as m

from .hostattach import ATTACH_HELP, RECONNECT_DELAYS_S, cmd_attach
from .output import (
    PROG,
    UsageError,
    exit_status,
    exit_text,
    print_instance,
    print_instances,
    print_json,
    print_pools,
    print_sessions,
    print_status,
)

DEFAULT_INSTANCE_NAME = "dev"
#: Bound for calls that wait for process trees to end (stop, destroy, kill, delete) beyond their grace.
TREE_CALL_TIMEOUT_S = 120.0
#: Bound of a container or VM provision or fork (an image copied on vfs storage, a guest's memory).
MAKE_CALL_TIMEOUT_S = 300.0


def _runtime_of(image: str | None, runtime: str | None) -> str:
    """``--runtime``, else what ``--image`` says: a VM boot image (``qcow2://``, ``direct://``) or
    a container image (an OCI reference); no image: a host instance."""
    if runtime is not None:
        return runtime
    if image is None:
        return "host"
    return "vm" if image.startswith(("qcow2://", "direct://")) else "container"


def _pairs(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} {item!r} is not of the form KEY=VALUE")
        out[key] = value
    return out


def _tree_timeout(grace_s: float | None) -> float:
    return (grace_s or 0.0) + TREE_CALL_TIMEOUT_S


# -- lookups ------------------------------------------------------------------------------------


async def _resolve_instance(client: HostdClient, ref: str) -> str:
    """An instance id, given its id or its (unique) name."""
    try:
        return (await client.call(m.InstanceGetRequest(instance_id=ref))).instance.instance_id
    except HostdRemoteError as exc:
        if exc.code not in ("instance.not_found", "request.invalid"):
            raise
        not_found = exc
    named = [i for i in (await client.call(m.InstanceListRequest())).instances if i.name == ref]
    if len(named) == 1:
        return named[0].instance_id
    if len(named) > 1:
        raise UsageError(f"{len(named)} instances are named {ref!r}; give the instance id")
    raise not_found


async def _default_instance(client: HostdClient) -> str:
    for info in (await client.call(m.InstanceListRequest())).instances:
        if info.name == DEFAULT_INSTANCE_NAME and info.state != "destroyed":
            return info.instance_id
    raise UsageError(
        f"no --instance given and no instance named {DEFAULT_INSTANCE_NAME!r} exists "
        f"(create one: {PROG} instance create {DEFAULT_INSTANCE_NAME})"
    )


# -- commands -----------------------------------------------------------------------------------


async def cmd_status(client: HostdClient, args: argparse.Namespace) -> int:
    print_status(await client.call(m.StatusRequest()), args.json)
    return 0


#: How long ``upgrade`` waits for the new image to answer (the check runs before the answer).
UPGRADE_WAIT_S = 60.0


async def cmd_upgrade(client: HostdClient | None, args: argparse.Namespace) -> int:
    """Ask hostd to upgrade in place (the code now installed checks first), then wait for the new
    image to answer on the same socket, with the same pid."""
    async with open_hostd(args.socket, client_name=PROG) as first:
        before = await first.call(m.StatusRequest())
        answer = await first.call(m.UpgradeRequest(), timeout=UPGRADE_WAIT_S)
    started = time.monotonic()
    with trio.move_on_after(UPGRADE_WAIT_S) as waited:
        while True:
            try:
                async with open_hostd(args.socket, client_name=PROG, connect_timeout=UPGRADE_WAIT_S) as again:
                    after = await again.call(m.StatusRequest())
            except HostdUnavailable:
                await trio.sleep(0.05)
                continue
            if after.upgrades > before.upgrades or after.pid != before.pid:
                break
            await trio.sleep(0.05)  # answered by the old image just before it stopped accepting
    if waited.cancelled_caught:
        print(f"{PROG}: hostd did not answer within {UPGRADE_WAIT_S:g} s of its upgrade: see its log", file=sys.stderr)
        return 1
    took_ms = (time.monotonic() - started) * 1000
    if args.json:
        print_json({"before": before, "upgrade": answer, "after": after, "took_ms": round(took_ms)})
    elif after.pid != before.pid:
        print(f"hostd restarted as pid {after.pid} instead of upgrading in place (was {before.pid}): see its log")
        return 1
    else:
        print(
            f"hostd {after.pid} upgraded in place ({before.hostd_version} -> {after.hostd_version}, upgrade "
            f"#{after.upgrades}): {answer.sessions} sessions and {answer.execs} execs handed over in {took_ms:.0f} ms"
        )
    return 0


async def cmd_instances(client: HostdClient, args: argparse.Namespace) -> int:
    print_instances((await client.call(m.InstanceListRequest(pool_slots=args.pool_slots))).instances, args.json)
    return 0


async def cmd_instance_create(client: HostdClient, args: argparse.Namespace) -> int:
    runtime = _runtime_of(args.image, args.runtime)
    if runtime == "host" and args.image is not None:
        raise UsageError("--image names a container or VM image; a host instance has none")
    workdir = args.workdir
    if workdir and runtime == "host":
        workdir = os.path.abspath(workdir)  # a container's is a path inside it, taken as given
    vm = m.VmSpec(memory_mib=args.memory_mib, vcpus=args.vcpus) if runtime == "vm" else None
    request = m.InstanceProvisionRequest(
        instance_id=args.id or new_id(),
        name=args.name,
        runtime=runtime,
        working_dir=workdir or None,
        env=_pairs(args.env, "--env"),
        labels=_pairs(args.label, "--label"),
        command=args.argv or None,
        start=not args.no_start,
        image=args.image,
        vm=vm,
    )
    timeout = None if runtime == "host" else MAKE_CALL_TIMEOUT_S
    print_instance((await client.call(request, timeout=timeout)).instance, args.json)
    return 0


async def cmd_instance_fork(client: HostdClient, args: argparse.Namespace) -> int:
    source = await _resolve_instance(client, args.instance)
    request = m.InstanceForkRequest(source_instance_id=source, instance_id=args.id or new_id(), name=args.name)
    print_instance((await client.call(request, timeout=MAKE_CALL_TIMEOUT_S)).instance, args.json)
    return 0


async def cmd_pools(client: HostdClient, args: argparse.Namespace) -> int:
    print_pools((await client.call(m.PoolListRequest())).pools, args.json)
    return 0


async def cmd_instance_start(client: HostdClient, args: argparse.Namespace) -> int:
    instance_id = await _resolve_instance(client, args.instance)
    print_instance((await client.call(m.InstanceStartRequest(instance_id=instance_id))).instance, args.json)
    return 0


async def cmd_instance_stop(client: HostdClient, args: argparse.Namespace) -> int:
    instance_id = await _resolve_instance(client, args.instance)
    request = m.InstanceStopRequest(instance_id=instance_id, grace_s=args.grace)
    print_instance((await client.call(request, timeout=_tree_timeout(args.grace))).instance, args.json)
    return 0


async def cmd_instance_sleep(client: HostdClient, args: argparse.Namespace) -> int:
    instance_id = await _resolve_instance(client, args.instance)
    request = m.InstanceSleepRequest(instance_id=instance_id, how=args.how)
    print_instance((await client.call(request, timeout=MAKE_CALL_TIMEOUT_S)).instance, args.json)
    return 0


async def cmd_instance_wake(client: HostdClient, args: argparse.Namespace) -> int:
    instance_id = await _resolve_instance(client, args.instance)
    answer = await client.call(m.InstanceWakeRequest(instance_id=instance_id), timeout=MAKE_CALL_TIMEOUT_S)
    print_instance(answer.instance, args.json)
    return 0


async def cmd_instance_destroy(client: HostdClient, args: argparse.Namespace) -> int:
    instance_id = await _resolve_instance(client, args.instance)
    request = m.InstanceDestroyRequest(instance_id=instance_id, grace_s=args.grace)
    print_instance((await client.call(request, timeout=_tree_timeout(args.grace))).instance, args.json)
    return 0


async def cmd_session_new(client: HostdClient, args: argparse.Namespace) -> int:
    if not args.argv:
        raise UsageError("session new: give the command to run after --, e.g. session new -- bash")
    instance_id = await (_resolve_instance(client, args.instance) if args.instance else _default_instance(client))
    request = m.SessionCreateRequest(
        instance_id=instance_id,
        argv=args.argv,
        cwd=os.path.abspath(args.cwd) if args.cwd else None,
        env=_pairs(args.env, "--env"),
        cols=args.cols,
        rows=args.rows,
        session_id=args.id,
    )
    session = (await client.call(request)).session
    if args.json:
        print_json(session)
    else:
        print(session.session_id)
    return 0


async def cmd_session_delete(client: HostdClient, args: argparse.Namespace) -> int:
    await client.call(m.SessionDeleteRequest(session_id=args.session_id), timeout=_tree_timeout(None))
    return 0


async def cmd_sessions(client: HostdClient, args: argparse.Namespace) -> int:
    instance_id = await _resolve_instance(client, args.instance) if args.instance else None
    print_sessions((await client.call(m.SessionListRequest(instance_id=instance_id))).sessions, args.json)
    return 0


async def cmd_logs(client: HostdClient, args: argparse.Namespace) -> int:
    info = (await client.call(m.SessionGetRequest(session_id=args.session_id))).session
    start = info.first_seq if args.from_seq is None else args.from_seq
    end = info.next_seq  # without --follow: what the ring held when we asked
    if not args.follow and start >= end:
        return 0
    out = sys.stdout.buffer
    request = m.SessionSubscribeRequest(session_id=args.session_id, from_seq=start)
    async with client.stream(request) as events, aclosing(events):
        async for event in events:
            if isinstance(event, m.SessionOutput):
                out.write(event.data)
                out.flush()
                if not args.follow and event.seq >= end - 1:
                    break
            elif isinstance(event, m.SessionLagged):
                print(f"[{PROG}: output {event.missed_from}..{event.resume_seq - 1} left the ring]", file=sys.stderr)
                if not args.follow and event.resume_seq >= end:
                    break
    return 0


async def cmd_send(client: HostdClient, args: argparse.Namespace) -> int:
    data = args.text.encode() + (b"\r" if args.newline else b"")
    written = (await client.call(m.SessionWriteRequest(session_id=args.session_id, data=data))).written
    if args.json:
        print_json({"written": written})
    return 0


async def cmd_kill(client: HostdClient, args: argparse.Namespace) -> int:
    if args.signal is not None:
        sig: str | int = int(args.signal) if args.signal.isdigit() else args.signal
        await client.call(m.SessionSignalRequest(session_id=args.session_id, signal=sig))
        if args.json:
            print_json({"session_id": args.session_id, "signal": sig})
        return 0
    request = m.SessionKillRequest(session_id=args.session_id, grace_s=args.grace)
    session = (await client.call(request, timeout=_tree_timeout(args.grace))).session
    if args.json:
        print_json(session)
    else:
        print(f"{session.session_id} {exit_text(session.exit_code, session.signal)}")
    return 0


# -- parser -------------------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    # Accepted before or after the command; SUPPRESS keeps a later default from hiding an earlier value.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--socket", default=argparse.SUPPRESS, help="hostd socket (default: see above)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog=PROG,
        parents=[common],
        description="Control the agentic-sandbox host supervisor (hostd). The socket is --socket, else "
        f"$AIWG_HOSTD_SOCKET, else ./{dev_hostd_socket()} if it exists, else {PROD_HOSTD_SOCKET}.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(parent: Any, name: str, func: Callable[..., Awaitable[int]], help: str, **kw: Any) -> Any:
        p = parent.add_parser(name, parents=[common], help=help, description=kw.pop("description", help), **kw)
        p.set_defaults(func=func)
        return p

    command(sub, "status", cmd_status, "what hostd is and holds")
    p = command(
        sub,
        "upgrade",
        cmd_upgrade,
        "upgrade hostd in place to the code now installed: same pid, every session and exec kept "
        "(what systemctl reload does); refused, with the new code's error, if that code cannot take over",
    )
    p.set_defaults(own_connection=True)
    p = command(sub, "instances", cmd_instances, "list instances")
    p.add_argument("--pool-slots", action="store_true", help="also the ready slots of warm pools")
    command(sub, "pools", cmd_pools, "list warm pools (slots ready, being made, hits, misses)")

    instance = sub.add_parser("instance", help="create, start, stop, destroy an instance").add_subparsers(
        dest="instance_command", required=True, metavar="ACTION"
    )
    p = command(
        instance,
        "create",
        cmd_instance_create,
        "provision an instance (host, or a container or VM of --image); COMMAND is its main process",
        usage=f"{PROG} instance create [options] NAME [-- COMMAND ...]",
    )
    p.add_argument("name")
    p.add_argument("--id", help="instance id (default: a new UUIDv7)")
    p.add_argument(
        "--image",
        help="a container image (OCI reference, e.g. localhost/busybox:latest) or a VM boot image "
        "(qcow2://PATH@sha256:HEX, direct://KERNEL@sha256:HEX,INITRD@sha256:HEX); sets the runtime",
    )
    p.add_argument("--runtime", choices=("host", "container", "vm"), help="default: from --image (none: host)")
    p.add_argument("--memory-mib", type=int, default=192, help="a VM's memory (default 192)")
    p.add_argument("--vcpus", type=int, default=1, help="a VM's virtual CPUs (default 1)")
    p.add_argument("--workdir", help="working directory (default: hostd's choice)")
    p.add_argument("--label", action="append", metavar="K=V")
    p.add_argument("--env", action="append", metavar="K=V")
    p.add_argument("--no-start", action="store_true", help="provision only")
    p = command(instance, "fork", cmd_instance_fork, "copy a running instance into a new one named NAME")
    p.add_argument("instance", metavar="ID")
    p.add_argument("name")
    p.add_argument("--id", help="the fork's instance id (default: a new UUIDv7)")
    for name, func in (("start", cmd_instance_start), ("stop", cmd_instance_stop), ("destroy", cmd_instance_destroy)):
        p = command(instance, name, func, f"{name} an instance (by id or name)")
        p.add_argument("instance", metavar="ID")
        if name != "start":
            p.add_argument("--grace", type=float, help="seconds between SIGTERM and SIGKILL")
    p = command(instance, "sleep", cmd_instance_sleep, "put a running instance to sleep now (docs/sleep.md)")
    p.add_argument("instance", metavar="ID")
    p.add_argument("--how", choices=("freeze", "save"), help="default: as its idle policy says, else freeze")
    p = command(instance, "wake", cmd_instance_wake, "wake a sleeping instance")
    p.add_argument("instance", metavar="ID")

    session = sub.add_parser("session", help="create or delete a PTY session").add_subparsers(
        dest="session_command", required=True, metavar="ACTION"
    )
    p = command(
        session,
        "new",
        cmd_session_new,
        "start ARGV on a PTY session; prints its id",
        usage=f"{PROG} session new [options] -- ARGV ...",
    )
    p.add_argument("--instance", help=f"instance id or name (default: the one named {DEFAULT_INSTANCE_NAME!r})")
    p.add_argument("--id", help="session id (default: chosen by hostd)")
    p.add_argument("--cols", type=int, default=80)
    p.add_argument("--rows", type=int, default=24)
    p.add_argument("--cwd")
    p.add_argument("--env", action="append", metavar="K=V")
    p = command(session, "delete", cmd_session_delete, "kill (if running) and forget a session")
    p.add_argument("session_id", metavar="SID")

    p = command(sub, "sessions", cmd_sessions, "list PTY sessions")
    p.add_argument("--instance", help="only this instance (id or name)")

    p = command(sub, "logs", cmd_logs, "write a session's output (raw bytes) to stdout")
    p.add_argument("session_id", metavar="SID")
    p.add_argument("--from", dest="from_seq", type=int, metavar="N", help="first sequence (default: oldest held)")
    p.add_argument("--follow", "-f", action="store_true", help="keep streaming until the session exits")

    p = command(sub, "send", cmd_send, "type TEXT into a session")
    p.add_argument("session_id", metavar="SID")
    p.add_argument("text", metavar="TEXT")
    p.add_argument("--newline", "-n", action="store_true", help="then press Enter (sends CR)")

    p = command(sub, "kill", cmd_kill, "kill a session's process tree, or send it one signal")
    p.add_argument("session_id", metavar="SID")
    p.add_argument("--signal", "-s", metavar="NAME", help="send this signal (INT, SIGHUP, 9) instead of killing")
    p.add_argument("--grace", type=float, help="seconds between SIGTERM and SIGKILL")

    p = command(
        sub,
        "attach",
        cmd_attach,
        "attach this terminal to a session (detach: Ctrl-] or Ctrl-B d)",
        description=ATTACH_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("session_id", metavar="SID")
    p.add_argument("--from", dest="from_seq", type=int, metavar="N", help="start at sequence N")
    p.add_argument("--replay", action="store_true", help="replay what the ring holds, not from the last detach")
    p.add_argument(
        "--retries",
        type=int,
        default=len(RECONNECT_DELAYS_S),
        metavar="N",
        help=f"reconnect attempts after a lost connection (default {len(RECONNECT_DELAYS_S)}, about 8 s; 0: none)",
    )
    p.set_defaults(own_connection=True)
    return parser


# -- main ---------------------------------------------------------------------------------------


async def _run(args: argparse.Namespace) -> int:
    if getattr(args, "own_connection", False):
        return await args.func(None, args)
    async with open_hostd(args.socket, client_name=PROG) as client:
        return await args.func(client, args)


#: Commands whose trailing ``-- ARGV ...`` is a command line to run, not more arguments.
_TRAILING_ARGV = (["instance", "create"], ["session", "new"])


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse, with everything after ``--`` taken as ``args.argv`` for the commands that run one.

    argparse cannot do this itself: a ``nargs="*"`` positional after options is matched
    (empty) as soon as the first positional is, so ``create NAME --id X -- CMD`` would fail.
    """
    trailing: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        head = argv[:cut]
        if any(head[i : i + 2] in _TRAILING_ARGV for i in range(len(head))):
            argv, trailing = head, argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    args.argv = trailing
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.socket = getattr(args, "socket", None) or find_hostd_socket()
    args.json = getattr(args, "json", False)
    try:
        return trio.run(_run, args)
    except BaseException as raised:  # sorted by exit_status; anything unknown re-raises
        return exit_status(raised, args.socket)


if __name__ == "__main__":
    sys.exit(main())
