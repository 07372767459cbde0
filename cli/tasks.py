"""``agentic send | tasks | task``: A2A tasks of an instance, over the controller's HTTP+JSON binding.

* ``agentic send INSTANCE TEXT``: sends TEXT as a message (``message:stream``) and prints the
  task's events as they come: the agent's stdout artifact to stdout, its stderr artifact to stderr,
  status changes (with the agent's message) to stderr. Exits with the task's outcome: 0 completed,
  the agent's exit status (1 if none) when failed, 130 canceled, 1 otherwise. ``--task`` sends a
  follow-up to a running task; ``--context`` names the context.
* ``agentic tasks INSTANCE``: the instance's tasks, newest first (``--status``, ``--context``,
  ``--limit``; ``--json`` for the raw page).
* ``agentic task INSTANCE TASK_ID``: one task: state, context and its output (``--json``: raw).

INSTANCE is an instance id, or a name looked up with the admin API (that needs an operator token).
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

from .controllerapi import Api, ApiError

RUNTIME_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/runtime/v1"
A2A_HEADERS = {"A2A-Version": "1.0", "A2A-Extensions": RUNTIME_EXTENSION}


def register(subparsers: Any) -> None:
    send = subparsers.add_parser("send", help="send a message to an instance and stream the task")
    send.add_argument("instance", help="instance id or name")
    send.add_argument("text", help="the message text")
    send.add_argument("--task", help="a running task to send a follow-up to")
    send.add_argument("--context", help="context id for a new task")
    send.set_defaults(func=cmd_send)

    listing = subparsers.add_parser("tasks", help="list an instance's tasks")
    listing.add_argument("instance")
    listing.add_argument("--status", help="e.g. TASK_STATE_WORKING")
    listing.add_argument("--context")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_tasks)

    show = subparsers.add_parser("task", help="show one task")
    show.add_argument("instance")
    show.add_argument("task_id")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_task)


def agent_path(api: Api, instance: str) -> str:
    return f"/agents/{api.find_instance(instance)}"


def outcome_status(task: dict[str, Any]) -> int:
    state = task.get("status", {}).get("state")
    if state == "TASK_STATE_COMPLETED":
        return 0
    if state == "TASK_STATE_CANCELED":
        return 130
    if state == "TASK_STATE_FAILED":
        code = task.get("metadata", {}).get("exit_code")
        return code if isinstance(code, int) and 0 < code < 256 else 1
    return 1


def _status_line(status: dict[str, Any]) -> str:
    text = "".join(p.get("text", "") for p in (status.get("message") or {}).get("parts", []))
    state = str(status.get("state", "")).removeprefix("TASK_STATE_").lower()
    return f"[{state}] {text}".rstrip()


def cmd_send(api: Api, args: argparse.Namespace) -> int:
    controller = api.with_headers(A2A_HEADERS)
    path = agent_path(controller, args.instance)
    message: dict[str, Any] = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": args.text}]}
    if args.task:
        message["taskId"] = args.task
    if args.context:
        message["contextId"] = args.context
    task: dict[str, Any] = {}
    for event in controller.sse(f"{path}/message:stream", {"message": message}):
        if "task" in event:
            task = event["task"]
            print(f"task {task['id']} ({_status_line(task['status'])})", file=sys.stderr, flush=True)
        elif "artifactUpdate" in event:
            artifact = event["artifactUpdate"]["artifact"]
            out = sys.stderr if artifact.get("artifactId") == "stderr" else sys.stdout
            out.write("".join(p.get("text", "") for p in artifact.get("parts", [])))
            out.flush()
        elif "statusUpdate" in event:
            task["status"] = event["statusUpdate"]["status"]
            print(_status_line(task["status"]), file=sys.stderr, flush=True)
    if not task:
        raise ApiError(0, "", "the stream ended before the task was sent")
    final = controller.request("GET", f"{path}/tasks/{task['id']}?historyLength=0")
    return outcome_status(final)


def cmd_tasks(api: Api, args: argparse.Namespace) -> int:
    controller = api.with_headers(A2A_HEADERS)
    path = agent_path(controller, args.instance)
    query = [f"pageSize={max(1, min(args.limit, 100))}"]
    if args.status:
        query.append(f"status={args.status}")
    if args.context:
        query.append(f"contextId={args.context}")
    page = controller.request("GET", f"{path}/tasks?{'&'.join(query)}")
    if args.json:
        print(json.dumps(page, indent=2))
        return 0
    print(f"{'TASK':36}  {'STATE':14}  {'UPDATED':27}  CONTEXT")
    for task in page["tasks"]:
        status = task["status"]
        state = status["state"].removeprefix("TASK_STATE_").lower()
        print(f"{task['id']:36}  {state:14}  {status.get('timestamp', ''):27}  {task.get('contextId', '')}")
    if page["nextPageToken"]:
        print(f"({page['totalSize']} tasks in all; showing {len(page['tasks'])})", file=sys.stderr)
    return 0


def cmd_task(api: Api, args: argparse.Namespace) -> int:
    controller = api.with_headers(A2A_HEADERS)
    path = agent_path(controller, args.instance)
    task = controller.request("GET", f"{path}/tasks/{args.task_id}")
    if args.json:
        print(json.dumps(task, indent=2))
        return 0
    print(f"task     {task['id']}")
    print(f"context  {task.get('contextId', '')}")
    print(f"status   {_status_line(task['status'])}")
    for artifact in task.get("artifacts", []):
        print(f"--- {artifact.get('name') or artifact['artifactId']}")
        sys.stdout.write("".join(p.get("text", "") for p in artifact.get("parts", [])))
    sys.stdout.flush()
    return 0
