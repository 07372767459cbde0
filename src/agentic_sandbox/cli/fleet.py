"""``agentic fleet``: fleet-workload/v1 from the command line, as upstream's ``sandboxctl fleet``.

* ``dispatch --file workload.json`` sends the document unchanged (``-``: stdin); it prints the
  stored record and says on stderr whether it was admitted (202) or an identical replay (200).
* ``inventory [--watch 5s]`` prints the inventory; with ``--watch``, again each time its revision
  moves, until interrupted.
* ``get CHILD_ID`` prints one record.
* ``reconcile --before-revision N --child-id X [--child-id Y ...]`` prints the classification of
  each expected child.

Read-only verbs take an operator token; the others the admin's. Authentication is the client's
usual (``--token``, a client certificate): it is never written into a record.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

from .controllerapi import Api, ApiError

FLEET = "/api/v2/fleet"
_DURATION = re.compile(r"^(?P<n>\d+(\.\d+)?)(?P<unit>ms|s|m)?$")


def duration(text: str) -> float:
    """``5s``, ``500ms``, ``1m`` or plain seconds, at least 0.1 s."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 5s, 500ms or 1m")
    seconds = float(match["n"]) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[match["unit"]]
    if seconds < 0.1:
        raise argparse.ArgumentTypeError("watch at most every 0.1 s")
    return seconds


def register(subparsers: Any) -> None:
    fleet = subparsers.add_parser("fleet", help="fleet-workload/v1: dispatch, inventory, get, reconcile")
    verbs = fleet.add_subparsers(dest="fleet_command", required=True, metavar="VERB")
    dispatch = verbs.add_parser("dispatch", help="admit a workload document (sent unchanged)")
    dispatch.add_argument("--file", required=True, help="the workload document (JSON); - reads stdin")
    dispatch.set_defaults(func=cmd_dispatch)
    inventory = verbs.add_parser("inventory", help="print the inventory")
    inventory.add_argument("--watch", type=duration, metavar="DURATION", help="print it again when it changes")
    inventory.set_defaults(func=cmd_inventory)
    get = verbs.add_parser("get", help="print one workload record")
    get.add_argument("child_id")
    get.set_defaults(func=cmd_get)
    reconcile = verbs.add_parser("reconcile", help="classify the expected children after a restart")
    reconcile.add_argument("--before-revision", type=int, required=True, help="your previous inventory revision")
    reconcile.add_argument("--child-id", action="append", required=True, dest="child_ids", help="an expected child")
    reconcile.set_defaults(func=cmd_reconcile)


def print_json(document: Any) -> None:
    """The contract's document as it came (no key dropped), indented."""
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


def _document(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()  # noqa: SIM115
        return json.loads(text)
    except OSError as exc:
        raise ApiError(0, "", f"{path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ApiError(0, "", f"{path} is not JSON: {exc}") from None


def cmd_dispatch(api: Api, args: argparse.Namespace) -> int:
    status, record = api.exchange("POST", f"{FLEET}/workloads", _document(args.file))
    print("admitted" if status == 202 else "already admitted (an identical replay)", file=sys.stderr)
    print_json(record)
    return 0


def cmd_inventory(api: Api, args: argparse.Namespace) -> int:
    shown: int | None = None
    while True:
        inventory = api.request("GET", f"{FLEET}/workloads")
        if inventory["inventory_revision"] != shown:
            shown = inventory["inventory_revision"]
            print_json(inventory)
            sys.stdout.flush()
        if args.watch is None:
            return 0
        time.sleep(args.watch)


def cmd_get(api: Api, args: argparse.Namespace) -> int:
    print_json(api.request("GET", f"{FLEET}/workloads/{args.child_id}"))
    return 0


def cmd_reconcile(api: Api, args: argparse.Namespace) -> int:
    body = {"before_revision": args.before_revision, "child_ids": args.child_ids}
    print_json(api.request("POST", f"{FLEET}/reconcile", body))
    return 0
