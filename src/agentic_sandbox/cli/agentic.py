"""``agentic``: the client of the controller's HTTP and WebSocket surfaces.

A thin list of registrations: each group of commands lives in a module of its own and adds its
subcommands with ``register(sub)``; a command is ``cmd(api, args) -> exit status``, or its async
form, which runs under trio (the PTY attach). A controller error is one line on stderr and
exit status 1. Connection options (``--url``, ``--token``,
``--token-file``) are shared (:mod:`cli.controllerapi`). Usage errors exit 2 (argparse's convention).
"""

from __future__ import annotations

import argparse
import inspect
import sys

import trio

from . import fleet, ptyattach, tasks
from .controllerapi import ApiError, resolve

#: Modules that add subcommands.
COMMANDS = (tasks, ptyattach, fleet)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentic", description="Client of the agentic-sandbox controller.")
    parser.add_argument("--url", help="controller base URL (AIWG_CONTROLLER_URL; default http://127.0.0.1:8122)")
    parser.add_argument("--token", help="bearer token (AIWG_TOKEN)")
    parser.add_argument(
        "--token-file",
        help="file holding the token (AIWG_TOKEN_FILE; dev: .run/admin-token or .run/instances/dev.token)",
    )
    parser.add_argument(
        "--cacert", help="PEM CAs to verify an https controller with (AIWG_CA_FILE; default: the system's)"
    )
    parser.add_argument("--cert", help="client certificate (PEM) for mTLS (AIWG_CLIENT_CERT); needs --key")
    parser.add_argument("--key", help="the client certificate's private key (AIWG_CLIENT_KEY)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Everything after ``--`` is ``args.argv`` (a command line to run), not more arguments."""
    trailing: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, trailing = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    args.argv = trailing
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        api = resolve(args.url, args.token, args.token_file, cacert=args.cacert, cert=args.cert, key=args.key)
        if inspect.iscoroutinefunction(args.func):
            status: int = trio.run(args.func, api, args)
        else:
            status = args.func(api, args)
        return status
    except ApiError as exc:
        print(f"agentic: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
