"""A host instance's directory on disk and the environment its processes get.

Layout (``<state_dir>/instances/<id>/``, 0700)::

    agent.env         KEY=VALUE lines for the agent (0600)
    metadata.json     what the instance is, for operators (0600)
    main.log          stdout+stderr of the main process, appended (0600; written by the registry)
    work/             default working dir when none is given and no workspace root is set (0700)

The environment of every process in an instance (:func:`child_env`) is a small base (PATH,
HOME = the working dir, locale, user) plus the agent values (ids, loadout, the request's env),
the same values agent.env holds.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
from pathlib import Path

import msgspec

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from ... import procspawn
from ...errors import RpcError
from ...statefile import mkdir_private, write_private

log = logging.getLogger(__name__)


def requested_working_dir(working_dir: str | None) -> str:
    """The real path of a requested working dir (``WORKING_DIR_NOT_FOUND`` unless it is an existing
    absolute directory); "" when none was requested (:func:`create` picks one)."""
    if working_dir is None:
        return ""
    if not os.path.isabs(working_dir) or not os.path.isdir(working_dir):
        raise RpcError(
            ErrorCode.WORKING_DIR_NOT_FOUND,
            f"working_dir {working_dir!r} is not an existing absolute directory",
            working_dir=working_dir,
        )
    return os.path.realpath(working_dir)


def create(inst_dir: Path, working_dir: str, workspace_root: str) -> str:
    """Create ``inst_dir`` and its parent (0700); return the working dir to use.

    That is ``working_dir`` when given, else ``workspace_root`` when set, else a new ``work/``
    inside the instance dir. OSError propagates (the caller undoes the provision).
    """
    mkdir_private(inst_dir.parent)
    mkdir_private(inst_dir)
    if working_dir:
        return working_dir
    if workspace_root:
        return workspace_root
    mkdir_private(inst_dir / "work")
    return str(inst_dir / "work")


def write_agent_env(info: m.InstanceInfo, env: dict[str, str]) -> None:
    """Write ``agent.env`` into the instance dir. OSError propagates."""
    data = "".join(f"{key}={value}\n" for key, value in _agent_values(info, env).items()).encode()
    write_private(Path(info.instance_dir) / "agent.env", data)


def write_metadata(info: m.InstanceInfo) -> None:
    """Rewrite ``metadata.json`` if the instance dir exists; a failed write is logged, never raised."""
    host = info.host or m.HostDetail()
    metadata = {
        "instance_id": info.instance_id,
        "name": info.name,
        "runtime": "host",
        "isolation_tier": "full-host-access",
        "isolation_warning": "host instances run with the full access of hostd's user",
        "agent_id": f"host-{info.instance_id}",
        "state": info.state,
        "pid": host.pid,
        "process_group_id": host.pgid,
        "working_dir": info.working_dir,
        "cgroup": host.cgroup,
        "loadout": info.loadout,
        "labels": info.labels,
    }
    inst_dir = Path(info.instance_dir)
    if inst_dir.is_dir():
        try:
            write_private(inst_dir / "metadata.json", msgspec.json.encode(metadata))
        except OSError as exc:
            log.error("cannot write metadata of instance %s: %s", info.instance_id, exc)


def remove(inst_dir: Path) -> None:
    """Remove the instance dir if it exists; what cannot be removed is logged and left (blocking)."""
    if inst_dir.exists():
        shutil.rmtree(inst_dir, onerror=lambda _f, path, exc: log.warning("removing %s: %s", path, exc[1]))


def child_env(info: m.InstanceInfo, env: dict[str, str]) -> dict[str, str]:
    """The whole environment of a process in the instance (nothing is inherited from hostd but PATH)."""
    user = _user()
    values = {
        "PATH": os.environ.get("PATH") or procspawn.DEFAULT_PATH,
        "HOME": info.working_dir,
        "LANG": "C.UTF-8",
        "USER": user,
        "LOGNAME": user,
        "SHELL": "/bin/sh",
    }
    values.update(_agent_values(info, env))
    values["AIWG_INSTANCE_DIR"] = info.instance_dir
    return values


def _agent_values(info: m.InstanceInfo, env: dict[str, str]) -> dict[str, str]:
    iid = info.instance_id
    values = {"AIWG_INSTANCE_ID": iid, "AGENT_INSTANCE_ID": iid, "AGENT_ID": f"host-{iid}"}
    if info.loadout:
        values["AGENT_LOADOUT"] = info.loadout
    values.update(env)
    return values


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
