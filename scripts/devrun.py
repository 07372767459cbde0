#!/usr/bin/env python3
"""``make run``: start ``agentic-hostd --dev`` and ``agentic-controller --dev`` together.

A thin wrapper: both children get the same environment (so the same ``AIWG_*`` settings: state in
``AIWG_STATE_DIR``, default ``./.run``) and behave exactly as when started by hand, one at a time.

* The children run in their own process group, so a Ctrl-C in the terminal reaches only this
  wrapper, which then stops them in order: the controller first, then hostd (SIGTERM, then SIGKILL
  after ``STOP_TIMEOUT_S``). SIGTERM to the wrapper does the same.
* If either child exits on its own, the other is stopped too and the wrapper exits with the
  child's status, so a broken half never keeps running alone.

Once the controller has the ``dev`` instance, the wrapper makes sure
``$AIWG_STATE_DIR/instances/dev.token`` (0600) holds a working A2A token for it (asking the admin
API for a new one when the file is missing or no longer valid) and prints the file's path.

Run it with the venv's python (``.venv/bin/python scripts/devrun.py``); the children are started
with the same interpreter (``-m hostd.main`` / ``-m controller.main``, what the entry points run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from proto import dev_hostd_socket

ROOT = Path(__file__).resolve().parent.parent
STOP_TIMEOUT_S = 15.0
HOSTD_WAIT_S = 10.0
DEV_TOKEN_WAIT_S = 60.0


def _start(module: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    # process_group=0: a terminal Ctrl-C goes to the wrapper only; it forwards exactly one signal.
    return subprocess.Popen([sys.executable, "-m", module, "--dev"], env=env, cwd=ROOT, process_group=0)


def _stop(proc: subprocess.Popen[bytes], name: str) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"devrun: {name} did not stop within {STOP_TIMEOUT_S:g} s; killing it", file=sys.stderr)
            proc.kill()
            proc.wait()
    return proc.returncode


def _wait_for_socket(path: str, hostd: subprocess.Popen[bytes]) -> None:
    """Give hostd a moment to listen so the controller's first connect succeeds (it retries anyway)."""
    deadline = time.monotonic() + HOSTD_WAIT_S
    while time.monotonic() < deadline and hostd.poll() is None and not os.path.exists(path):
        time.sleep(0.05)


def _http(method: str, url: str, token: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {token}", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _dev_instance_id(base: str, admin_token: str) -> str | None:
    status, body = _http("GET", f"{base}/api/v2/admin/instances", admin_token)
    if status != 200:
        return None
    for item in json.loads(body)["items"]:
        if item["name"] == "dev" and item["state"] == "running":
            return str(item["id"])
    return None


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text + "\n")
    os.replace(tmp, path)


def ensure_dev_token(env: dict[str, str], state_dir: str) -> None:
    """Write a valid A2A token of the dev instance to <state>/instances/dev.token; print its path."""
    base = f"http://{env.get('AIWG_LISTEN') or '127.0.0.1:8122'}"
    token_path = Path(state_dir) / "instances" / "dev.token"
    deadline = time.monotonic() + DEV_TOKEN_WAIT_S
    instance_id = None
    while time.monotonic() < deadline:
        try:
            admin_token = env.get("AIWG_ADMIN_TOKEN") or (Path(state_dir) / "admin-token").read_text().strip()
            instance_id = _dev_instance_id(base, admin_token)
        except (OSError, ValueError):
            instance_id = None
        if instance_id is not None:
            break
        time.sleep(0.2)
    if instance_id is None:
        print("devrun: the dev instance did not come up; no dev.token written", file=sys.stderr)
        return
    card = f"{base}/agents/{instance_id}/extendedAgentCard"
    try:
        current = token_path.read_text().strip()
    except OSError:
        current = ""
    if not current or _http("GET", card, current, {"A2A-Version": "1.0"})[0] != 200:
        status, body = _http("POST", f"{base}/api/v2/admin/instances/{instance_id}/a2a-token", admin_token)
        if status != 200:
            print(f"devrun: could not issue the dev instance's A2A token ({status})", file=sys.stderr)
            return
        _write_private(token_path, json.loads(body)["token"])
    print(f'dev A2A token: {token_path}  (curl -H "Authorization: Bearer $(cat {token_path})" ...)', flush=True)


def main() -> int:
    env = dict(os.environ)
    env.setdefault("AIWG_STATE_DIR", str(ROOT / ".run"))
    state_dir = env["AIWG_STATE_DIR"]
    socket_path = env.get("AIWG_HOSTD_SOCKET") or dev_hostd_socket(state_dir)

    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt  # leaves the wait below at once

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    hostd = controller = None
    status = 0
    try:
        hostd = _start("hostd.main", env)
        _wait_for_socket(socket_path, hostd)
        controller = _start("controller.main", env)
        threading.Thread(target=ensure_dev_token, args=(env, state_dir), daemon=True).start()
        pid, raw = os.wait()  # the first child to exit ends the pair
        name = "hostd" if pid == hostd.pid else "controller"
        status = os.waitstatus_to_exitcode(raw)
        (hostd if pid == hostd.pid else controller).returncode = status
        print(f"devrun: {name} exited with status {status}; stopping the other", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        # A second Ctrl-C or SIGTERM (``timeout`` signals its whole process group as well as the
        # child) must not cut the clean stop short and orphan hostd.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if controller is not None:
            _stop(controller, "controller")
        if hostd is not None:
            _stop(hostd, "hostd")
    if stopping:
        return 0
    return 128 - status if status < 0 else status  # a signal -N reads as 128+N, as in a shell


if __name__ == "__main__":
    sys.exit(main())
