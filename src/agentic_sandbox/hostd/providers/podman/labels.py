"""What podman's records mean for hostd: the labels hostd puts on containers, image references, and
how a container's state reads as an instance's (:func:`settle`). Pure: no podman calls here."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from agentic_sandbox.proto import messages as m

LABEL_NAMESPACE = "org.aiwg.hostd.namespace"
LABEL_INSTANCE = "org.aiwg.instance-id"
LABEL_NAME = "org.aiwg.instance-name"
#: Set on a container made as a warm pool slot: one no instance holds was never handed to anyone.
LABEL_POOL = "org.aiwg.pool"
CPU_PERIOD_US = 100_000
#: ``[registry[:port]/]name[:tag][@sha256:<64 hex>]``, lower-case repository, as runtime/v1 allows.
OCI_REFERENCE = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)
#: PID 1 of a container whose request and image name no main process: waits, exits on SIGTERM.
IDLE_MAIN = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]


def image_ref(attrs: Mapping[str, Any], requested: str) -> str:
    """``<repository>@sha256:<digest>`` of a resolved image (the digest podman keeps for it)."""
    digest = attrs.get("Digest") or f"sha256:{attrs.get('Id', '')}"
    if "@" in requested:
        return requested
    tags = [t for t in attrs.get("RepoTags") or [] if t and t != "<none>:<none>"]
    repo = tags[0] if tags else requested
    last = repo.rsplit("/", 1)[-1]
    if ":" in last:
        repo = repo[: len(repo) - len(last)] + last.split(":", 1)[0]
    return f"{repo}@{digest}"


def limit_options(limits: m.ResourceLimits | None, *, nofile: int, nproc: int) -> dict[str, Any]:
    """podman-py ``containers.create`` options for an instance's limits and rlimits."""
    options: dict[str, Any] = {
        "ulimits": [
            {"Name": "nofile", "Soft": nofile, "Hard": nofile},
            {"Name": "nproc", "Soft": nproc, "Hard": nproc},
        ]
    }
    if limits is not None and limits.cpus is not None:
        # podman-py drops nano_cpus; a CFS quota over a 100 ms period is the same limit.
        options["cpu_period"], options["cpu_quota"] = CPU_PERIOD_US, int(limits.cpus * CPU_PERIOD_US)
    if limits is not None and limits.memory_bytes is not None:
        options["mem_limit"] = limits.memory_bytes
    if limits is not None and limits.pids is not None:
        options["pids_limit"] = limits.pids
    return options


def has_own_command(attrs: Mapping[str, Any]) -> bool:
    """Whether an image names its own main process (``Cmd`` or ``Entrypoint``)."""
    config = attrs.get("Config") or {}
    return bool(config.get("Cmd") or config.get("Entrypoint"))


def settle(info: m.InstanceInfo, detail: m.ContainerDetail, attrs: Mapping[str, Any] | None, *, adopting: bool) -> bool:
    """Fold podman's record of an instance's container (None: there is none) into its info; True
    if anything changed. ``adopting``: hostd is finding it again after a restart or lost contact."""
    before = (info.state, info.note, detail.status, detail.pid)
    now = time.time()
    if attrs is None:
        detail.status, detail.pid = "removed", None
        if info.state != "failed" or adopting:
            info.state, info.adopted, info.stopped_at = "failed", False, now
            info.note = f"container {detail.container_name} no longer exists"
        return before != (info.state, info.note, detail.status, detail.pid)
    state = attrs.get("State") or {}
    detail.container_id = attrs.get("Id") or detail.container_id
    detail.status, detail.pid = state.get("Status"), state.get("Pid") or None
    was_live = info.state in ("running", "starting", "stopping") or (adopting and info.state == "failed")
    if detail.status == "running":
        if adopting or info.state == "failed":
            info.state, info.adopted, info.note = "running", True, None
    elif was_live and info.state != "stopping":
        code = state.get("ExitCode")
        info.exit_code, info.stopped_at, detail.pid = code, now, None
        info.state = "stopped" if code == 0 else "failed"
        info.note = f"container {detail.container_name} exited with code {code}" + (
            " while hostd was down" if adopting else ""
        )
        if adopting:
            info.adopted = False
    return before != (info.state, info.note, detail.status, detail.pid)
