"""``agentic send | answer | tasks | task``: A2A tasks of an instance, over the controller's HTTP+JSON binding.

* ``agentic send INSTANCE TEXT``: sends TEXT as a message (``message:stream``) and prints the
  task's events as they come: the agent's stdout artifact to stdout, its stderr artifact to stderr,
  status changes (with the agent's message) to stderr. When the agent asks a question
  (hitl-prompt/v1: the task waits for input) the answer is the next ``--answer JSON``, else asked
  at the terminal (:mod:`cli.prompts`), and the task is streamed on; without a terminal or an
  ``--answer`` left, it says how to answer later and exits 1. Exits with the task's outcome: 0
  completed, the agent's exit status (1 if none) when failed, 130 canceled, 1 otherwise.
  ``--task`` sends a follow-up to a running task; ``--context`` names the context.
* ``agentic answer INSTANCE TASK_ID [JSON]``: answers the question the task waits on (JSON, else
  asked at the terminal) and prints the task's state.
* ``agentic tasks INSTANCE``: the instance's tasks, newest first (``--status``, ``--context``,
  ``--limit``; ``--json`` for the raw page).
* ``agentic task INSTANCE TASK_ID``: one task: state, context, the question it waits on, and its
  output (``--json``: raw).

INSTANCE is an instance id, or a name looked up with the admin API (that needs an operator token).
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

from .controllerapi import Api, ApiError
from .prompts import HITL_EXTENSION, Asker, NoAnswer, answer_message, describe, envelope_of, parse_answer
from .prompts import validation_lines as invalid_lines

RUNTIME_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/runtime/v1"
A2A_HEADERS = {"A2A-Version": "1.0", "A2A-Extensions": f"{RUNTIME_EXTENSION}, {HITL_EXTENSION}"}


def register(subparsers: Any) -> None:
    send = subparsers.add_parser("send", help="send a message to an instance and stream the task")
    send.add_argument("instance", help="instance id or name")
    send.add_argument("text", help="the message text")
    send.add_argument("--task", help="a running task to send a follow-up to")
    send.add_argument("--context", help="context id for a new task")
    send.add_argument(
        "--answer",
        action="append",
        default=[],
        metavar="JSON",
        help="the answer (a JSON object) to the agent's next question; repeat for more questions",
    )
    send.set_defaults(func=cmd_send)

    answer = subparsers.add_parser("answer", help="answer the question a task waits on")
    answer.add_argument("instance")
    answer.add_argument("task_id")
    answer.add_argument("answer", nargs="?", metavar="JSON", help="the answer (a JSON object); else asked")
    answer.set_defaults(func=cmd_answer)

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
        metadata = task.get("metadata", {})
        code = metadata.get("exitCode", metadata.get("exit_code"))  # 1.0 spelling; upstream (0.3) spelling
        return code if isinstance(code, int) and 0 < code < 256 else 1
    return 1


def _status_line(status: dict[str, Any]) -> str:
    text = "".join(p.get("text", "") for p in (status.get("message") or {}).get("parts", []))
    state = str(status.get("state", "")).removeprefix("TASK_STATE_").lower()
    return f"[{state}] {text}".rstrip()


def _text(artifact: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in artifact.get("parts", []))


class Printer:
    """Prints a task's events across the streams of one ``send`` (its first message, then its
    answers): output as it comes, each character once, however the streams overlap (a stream
    after an answer starts with the Task, whose artifacts may hold output not printed yet)."""

    def __init__(self) -> None:
        self.printed: dict[str, int] = {}

    def _write(self, artifact_id: str, text: str) -> None:
        out = sys.stderr if artifact_id == "stderr" else sys.stdout
        out.write(text)
        out.flush()
        self.printed[artifact_id] = self.printed.get(artifact_id, 0) + len(text)

    def stream(self, controller: Api, path: str, message: dict[str, Any], *, catch_up: bool = True) -> dict[str, Any]:
        """Send ``message`` as a stream and print its events; the task as the stream left it.
        ``catch_up=False``: output the Task already holds is not printed (a follow-up sent with
        ``--task`` shows what comes after it)."""
        task: dict[str, Any] = {}
        for event in controller.sse(f"{path}/message:stream", {"message": message}):
            if "task" in event:
                task = event["task"]
                print(f"task {task['id']} ({_status_line(task['status'])})", file=sys.stderr, flush=True)
                for artifact in task.get("artifacts", []):
                    name, text = artifact.get("artifactId", ""), _text(artifact)
                    if catch_up:
                        self._write(name, text[self.printed.get(name, 0) :])
                    else:
                        self.printed[name] = len(text)
            elif "artifactUpdate" in event:
                artifact = event["artifactUpdate"]["artifact"]
                self._write(artifact.get("artifactId", ""), _text(artifact))
            elif "statusUpdate" in event:
                task["status"] = event["statusUpdate"]["status"]
                print(_status_line(task["status"]), file=sys.stderr, flush=True)
        if not task:
            raise ApiError(0, "", "the stream ended before the task was sent")
        return task


def interactive() -> bool:
    return sys.stdin.isatty()


def answered(send: Any, envelope: dict[str, Any], given: list[dict[str, Any]], hint: str) -> Any:
    """``send(payload)`` with the next given answer, else one asked at the terminal; asked again
    after a 422 (its errors shown) while a terminal is there. Raises NoAnswer with ``hint`` when
    there is no answer to give."""
    asker = Asker(sys.stdin.readline)
    while True:
        if given:
            payload = given.pop(0)
        elif interactive():
            payload = asker.ask(envelope)
        else:
            raise NoAnswer(hint)
        try:
            return send(payload)
        except ApiError as exc:
            if exc.status != 422:
                raise
            print(f"agentic: the answer was refused: {exc}", file=sys.stderr)
            for line in invalid_lines(exc.body):
                print(line, file=sys.stderr)
            if not interactive():
                raise NoAnswer("") from None


def cmd_send(api: Api, args: argparse.Namespace) -> int:
    controller = api.with_headers(A2A_HEADERS)
    path = agent_path(controller, args.instance)
    try:
        given = [parse_answer(text) for text in args.answer]
    except ValueError as exc:
        print(f"agentic: {exc}", file=sys.stderr)
        return 2
    message: dict[str, Any] = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": args.text}]}
    if args.task:
        message["taskId"] = args.task
    if args.context:
        message["contextId"] = args.context
    printer = Printer()
    task = printer.stream(controller, path, message, catch_up=not args.task)
    while (envelope := envelope_of(task)) is not None:
        hint = f"task {task['id']} waits for an answer: agentic answer {args.instance} {task['id']} '<JSON>'"

        def send(payload: dict[str, Any], task: dict[str, Any] = task, prompt_id: str = envelope["prompt_id"]) -> Any:
            return printer.stream(controller, path, answer_message(task, prompt_id, payload, str(uuid.uuid4())))

        try:
            task = answered(send, envelope, given, hint)
        except NoAnswer as exc:
            if str(exc):
                print(f"agentic: {exc}", file=sys.stderr)
            return 1
    final = controller.request("GET", f"{path}/tasks/{task['id']}?historyLength=0")
    return outcome_status(final)


def cmd_answer(api: Api, args: argparse.Namespace) -> int:
    controller = api.with_headers(A2A_HEADERS)
    path = agent_path(controller, args.instance)
    task = controller.request("GET", f"{path}/tasks/{args.task_id}?historyLength=0")
    envelope = envelope_of(task)
    if envelope is None:
        raise ApiError(409, "", f"task {task['id']} waits for no answer ({_status_line(task['status'])})")
    try:
        given = [parse_answer(args.answer)] if args.answer is not None else []
    except ValueError as exc:
        print(f"agentic: {exc}", file=sys.stderr)
        return 2

    def send(payload: dict[str, Any]) -> Any:
        message = answer_message(task, envelope["prompt_id"], payload, str(uuid.uuid4()))
        body = {"message": message, "configuration": {"returnImmediately": True}}
        return controller.request("POST", f"{path}/message:send", body)["task"]

    if not given and interactive():
        print(describe(envelope), file=sys.stderr)
    try:
        after = answered(send, envelope, given, "no answer given: pass it as JSON or run this at a terminal")
    except NoAnswer as exc:
        if str(exc):
            print(f"agentic: {exc}", file=sys.stderr)
        return 1
    print(f"task {after['id']} {_status_line(after['status'])}", file=sys.stderr)
    return 0


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
    envelope = envelope_of(task)
    if envelope is not None:
        print(describe(envelope))
    for artifact in task.get("artifacts", []):
        print(f"--- {artifact.get('name') or artifact['artifactId']}")
        sys.stdout.write("".join(p.get("text", "") for p in artifact.get("parts", [])))
    sys.stdout.flush()
    return 0
