"""``python -m agentic_sandbox.hostd.providers.libvirt.guestexec URI UUID -- ARGV...``: run ARGV in a
VM through qemu-guest-agent.

hostd runs this as the process of an exec in a VM instance (:meth:`.provider.VmProvider.spawn_spec`),
so exec ids, exit codes, cancel, timeouts and output streams work as for host execs.
It waits for the guest agent to answer ``guest-ping`` (the guest may still be booting; at most
``AIWG_GUEST_AGENT_WAIT_S``, default 60 s), starts ARGV with ``guest-exec`` (environment from the
JSON object in ``AIWG_GUEST_ENV``, output captured), polls ``guest-exec-status`` and, once the
guest process ended, writes its stdout and stderr and exits with its exit code (or dies of its
signal). While the VM sleeps (suspended or saved, docs/sleep.md) the poll waits for its wake.

Not streamed: qemu-guest-agent hands over the output only when the process has ended, so an exec's
output arrives all at once at the end (qemu-ga keeps at most 16 MiB of each stream). No stdin is
passed, and there is no control channel. On SIGTERM (cancel, kill, timeout) it asks the agent to
``kill -TERM`` the guest process and exits 143.

Exit 125 with a message on stderr when libvirt or the agent fails before the command ran.
Creates no process on the host; imports libvirt, so only hostd runs it.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import time
from typing import Any

from agentic_sandbox.hostd.providers.libvirt.connection import libvirt_error, libvirt_module

AGENT_TIMEOUT_S = 10
FAILED = 125


class _Stop(Exception):
    pass


def _agent(dom: Any, command: str, **arguments: Any) -> Any:
    import libvirt_qemu

    payload = json.dumps({"execute": command, "arguments": arguments} if arguments else {"execute": command})
    return json.loads(libvirt_qemu.qemuAgentCommand(dom, payload, AGENT_TIMEOUT_S, 0))["return"]


def _wait_for_agent(dom: Any, libvirt: Any, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            _agent(dom, "guest-ping")
            return
        except libvirt.libvirtError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _asleep(dom: Any, libvirt: Any) -> bool:
    """The domain sleeps (docs/sleep.md): suspended, or saved to disk (shut off with a managed save
    image); its guest processes are as they were and go on at the wake."""
    try:
        state, _reason = dom.state()
        if state == libvirt.VIR_DOMAIN_PAUSED:
            return True
        return bool(state == libvirt.VIR_DOMAIN_SHUTOFF and dom.hasManagedSaveImage(0))
    except libvirt.libvirtError:
        return False  # gone: the status poll's own error is the answer


def _until_exited(dom: Any, libvirt: Any, pid: int) -> Any:
    """Poll ``guest-exec-status`` until the guest process ended. While the VM sleeps the agent
    cannot answer: wait for the wake (hostd moves the exec's timeout by the time slept) instead of
    taking the sleep for a failure."""
    delay = 0.01
    while True:
        try:
            status = _agent(dom, "guest-exec-status", pid=pid)
        except libvirt.libvirtError:
            if not _asleep(dom, libvirt):
                raise
            while _asleep(dom, libvirt):
                time.sleep(0.05)
            _wait_for_agent(dom, libvirt, AGENT_TIMEOUT_S)  # a restored guest's agent takes a moment
            delay = 0.01
            continue
        if status["exited"]:
            return status
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m agentic_sandbox.hostd.providers.libvirt.guestexec URI UUID -- ARGV...", file=sys.stderr)
        return 2
    uri, uuid, command = argv[0], argv[1], argv[3:]
    libvirt = libvirt_module()
    env = json.loads(os.environ.get("AIWG_GUEST_ENV") or "{}")
    pid: int | None = None

    def stop(_signum: int, _frame: object) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    try:
        conn = libvirt.open(uri)
        dom = conn.lookupByUUIDString(uuid)
        _wait_for_agent(dom, libvirt, float(os.environ.get("AIWG_GUEST_AGENT_WAIT_S") or 60))
        started = _agent(
            dom,
            "guest-exec",
            path=command[0],
            arg=command[1:],
            env=[f"{k}={v}" for k, v in env.items()],
            **{"capture-output": True},
        )
        pid = int(started["pid"])
        status = _until_exited(dom, libvirt, pid)
    except _Stop:
        if pid is not None:
            try:
                _agent(dom, "guest-exec", path="/bin/kill", arg=["-TERM", str(pid)])
            except Exception:
                pass
        return 128 + signal.SIGTERM
    except (libvirt.libvirtError, KeyError, ValueError) as exc:
        print(f"guest-exec of {command[0]!r} failed: {libvirt_error(exc)}", file=sys.stderr)
        return FAILED
    os.write(1, base64.b64decode(status.get("out-data", "")))
    os.write(2, base64.b64decode(status.get("err-data", "")))
    if "signal" in status:
        signal.signal(int(status["signal"]), signal.SIG_DFL)
        os.kill(os.getpid(), int(status["signal"]))
    return int(status.get("exitcode", FAILED))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
