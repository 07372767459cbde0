"""Tasks as A2A v1.0 JSON, with the runtime/v1 metadata every Task carries.

``runtime.*`` keys are never stored: they are added here, to every Task of every operation and
binding, equal to the card's params (``runtime.instance_id``, ``runtime.kind``,
``runtime.provider``). ``runtime.host`` is added only where policy allows (operator callers, see
:attr:`controller.a2a.edge.Caller.discloses_host`) and is then the host's name; otherwise absent.
A hitl-prompt/v1 envelope on the status is shown only to callers that activated the extension.

The metadata keys this project adds (:data:`~agentic_sandbox.controller.tasks.agentio.OUTCOME_KEYS`,
stored as upstream names them: ``fail_kind``, ``exit_code`` ...) are camelCase on the 1.0 wire, as
every other key of an A2A 1.0 object is (``failKind``, ``exitCode`` ...); a 0.3 caller gets upstream's
names. Keys an extension's spec names (``runtime.*``, ``kagent.dev/...``) are shown as spelled.
"""

from __future__ import annotations

import socket
from typing import Any

from ..store import InstanceRecord, Store, TaskSnapshot
from ..tasks.agentio import OUTCOME_KEYS
from ..tasks.prompts import shown
from ..tasks.service import task_not_found
from .caller import WIRE_1_0
from .card import instance_url, runtime_params

#: History a Task carries when the request does not say (``historyLength`` unset).
DEFAULT_HISTORY = 100


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(word.title() for word in rest)


#: Our metadata keys as the 1.0 wire spells them.
WIRE_KEYS_1_0 = {key: _camel(key) for key in OUTCOME_KEYS}


def wire_metadata(metadata: dict[str, Any], wire: str) -> dict[str, Any]:
    """Task metadata with our keys as the caller's A2A version spells them (module docstring)."""
    if wire != WIRE_1_0 or not any(key in WIRE_KEYS_1_0 for key in metadata):
        return metadata
    return {WIRE_KEYS_1_0.get(key, key): value for key, value in metadata.items()}


def runtime_metadata(instance: InstanceRecord, *, disclose_host: bool) -> dict[str, Any]:
    params = runtime_params(instance)
    out: dict[str, Any] = {"runtime.instance_id": params["instance_id"], "runtime.kind": params["runtime"]}
    if "provider" in params:
        out["runtime.provider"] = params["provider"]
    if "capabilities" in params:
        out["runtime.capabilities"] = list(params["capabilities"])
    if disclose_host:
        host = socket.gethostname()
        if host:
            out["runtime.host"] = host[:256]
    return out


def task_view(
    snap: TaskSnapshot,
    instance: InstanceRecord,
    *,
    disclose_host: bool,
    prompts: bool,
    base_url: str,
    wire: str = WIRE_1_0,
) -> dict[str, Any]:
    """The Task, with the artifacts the snapshot holds; ``prompts``: the caller activated
    hitl-prompt/v1 (else a prompt envelope is left out). A file an agent returned that is kept on
    disk is shown as a ``url`` part under ``base_url`` (the caller's view of this controller)."""
    rec = snap.record
    task: dict[str, Any] = {"id": rec.id, "contextId": rec.context_id, "status": shown(rec.status, prompts)}
    if snap.artifacts:
        files = f"{instance_url(base_url, instance.id)}/tasks/{rec.id}/files/"
        task["artifacts"] = [_with_file_urls(artifact, files) for artifact in snap.artifacts]
    if snap.history:
        task["history"] = snap.history
    task["metadata"] = {**wire_metadata(rec.metadata, wire), **runtime_metadata(instance, disclose_host=disclose_host)}
    return task


def _with_file_urls(artifact: dict[str, Any], files: str) -> dict[str, Any]:
    """The artifact with each file part (``{"file": {"id", "size"}}``, see
    :mod:`controller.tasks.files`) as the A2A ``url`` part a client fetches it by."""
    parts = artifact.get("parts") or []
    if not any("file" in part for part in parts):
        return artifact
    shown_parts = []
    for part in parts:
        if "file" in part:
            ref = part["file"]
            part = {k: v for k, v in part.items() if k != "file"}
            part["url"] = files + ref["id"]
            part["metadata"] = {**(part.get("metadata") or {}), "size": ref["size"]}
        shown_parts.append(part)
    return {**artifact, "parts": shown_parts}


async def read_snapshot(
    store: Store, instance_id: str, task_id: str, history_length: int | None, *, artifacts: bool = True
) -> TaskSnapshot:
    """The task of this instance as one read of the store finds it (``history_length`` unset:
    the default history); TASK_NOT_FOUND if the instance has no such task."""
    limit = DEFAULT_HISTORY if history_length is None else history_length
    snap = await store.tasks.snapshot(task_id, limit, artifacts=artifacts)
    if snap is None or snap.record.instance_id != instance_id:
        raise task_not_found(task_id)
    return snap
