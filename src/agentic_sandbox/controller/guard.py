"""The process guard: the controller never starts a process; hostd runs everything.

:func:`install_process_guard` adds a ``sys.addaudithook`` hook that raises
:class:`ProcessCreationRefused` (a ``RuntimeError``) for every audit event that creates a process:
``subprocess.Popen`` (so ``os.popen`` and ``trio.run_process`` too), ``os.fork``, ``os.forkpty``
(``pty.fork``), ``os.exec*``, ``os.posix_spawn[p]``, ``os.spawn*``, ``os.system`` and ``pty.spawn``.
Raising from the hook aborts the call before anything is created.

``agentic-controller``'s ``main()`` installs it before serving. Audit hooks cannot be removed, so it
is never installed by ``create_app`` (tests serving the app in-process keep their own freedom) and
installing it twice is a no-op. It is a fence against mistakes and dependencies, not a sandbox:
native code can still call ``fork(2)`` directly.
"""

from __future__ import annotations

import sys
from typing import Any

REFUSED_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.startfile",
        "pty.spawn",
    }
)

_MARK = "_aiwg_controller_process_guard"


class ProcessCreationRefused(RuntimeError):
    """A process creation attempt inside the controller process."""


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event in REFUSED_EVENTS:
        raise ProcessCreationRefused(f"the controller never starts processes ({event} refused); hostd runs them")


def install_process_guard() -> None:
    """Refuse process creation in this process from now on (irreversible; idempotent)."""
    if getattr(sys, _MARK, False):
        return
    sys.addaudithook(_hook)
    setattr(sys, _MARK, True)


def guard_installed() -> bool:
    return bool(getattr(sys, _MARK, False))
