"""What environment a caller may hand an instance, a session or an exec.

hostd sets some variables itself (the instance's identity, the tree mark that finds a process tree,
the control channel's fd): a caller must never override them, or a child could pass for another
instance or hide from a kill sweep. Keys must be variable names and values free of NUL (execve
would refuse them, after a fork).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from agentic_sandbox.proto import ErrorCode

from .control import CONTROL_FD_ENV
from .errors import RpcError
from .proctree import TREE_ENV

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Keys hostd sets itself; a request may not override them.
RESERVED_ENV = frozenset(
    {"AIWG_INSTANCE_ID", "AGENT_INSTANCE_ID", "AGENT_ID", "AIWG_INSTANCE_DIR", TREE_ENV, CONTROL_FD_ENV}
)


def validate_child_env(env: Mapping[str, str]) -> None:
    """Refuse (``REQUEST_INVALID``) env a caller hands a session or exec: keys that are no variable
    names or that hostd sets itself, and NULs."""
    for key, value in env.items():
        if not _ENV_KEY.match(key):
            raise RpcError(ErrorCode.REQUEST_INVALID, f"env key {key!r} is not a valid variable name", key=key)
        if key in RESERVED_ENV:
            raise RpcError(ErrorCode.REQUEST_INVALID, f"env key {key!r} is set by hostd", key=key)
        if "\0" in value:
            raise RpcError(ErrorCode.REQUEST_INVALID, f"env value of {key!r} contains a NUL", key=key)


def validate_instance_env(env: Mapping[str, str]) -> None:
    """As :func:`validate_child_env`, and no newlines either: an instance's env is also written to a
    file with one entry per line (``agent.env``)."""
    validate_child_env(env)
    for key, value in env.items():
        if "\n" in value or "\r" in value:
            raise RpcError(ErrorCode.REQUEST_INVALID, f"env value of {key!r} contains a newline", key=key)
