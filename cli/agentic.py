"""``agentic``: the client of the controller's HTTP surfaces (A2A tasks; the PTY attach joins it).

A thin list of registrations: each command family lives in its own module and adds its
subcommands with ``register(subparsers)``; every subcommand sets ``func(args) -> exit status``.
The controller's URL and the token come from the shared options (see :mod:`cli.controllerlink`).
Usage errors exit 2 (argparse's convention).
"""

from __future__ import annotations

import argparse
import sys

from . import controllerlink, tasks


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentic", description="Client of the agentic-sandbox controller.")
    controllerlink.add_options(parser)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    tasks.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except controllerlink.ClientError as exc:
        print(f"agentic: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())
