#!/usr/bin/env python3
"""``make run``: start ``agentic-hostd --dev`` and ``agentic-controller --dev`` together.

A thin wrapper: both children get the same environment (so the same ``AIWG_*`` settings: state in
``AIWG_STATE_DIR``, default ``./.run``) and behave exactly as when started by hand, one at a time.

* The children run in their own process group, so a Ctrl-C in the terminal reaches only this
  wrapper, which then stops them in order: the controller first, then hostd (SIGTERM, then SIGKILL
  after ``STOP_TIMEOUT_S``). SIGTERM to the wrapper does the same.
* If a child exits on its own, the others are stopped too and the wrapper exits with the
  child's status, so a broken half never keeps running alone.
* Containers: unless ``AIWG_PODMAN_SOCKET`` is set, hostd gets a podman service of its own on a
  private socket (:func:`podman_env`: ``<state>/podman/``, vfs storage, started by hostd), and the
  ``localhost/busybox`` image the built-in ``busybox`` loadout runs is built there first when
  missing (``scripts/busybox_image.py``). Without podman or busybox-static this is skipped with a
  note, and hostd says the container provider is unavailable.

* VMs (``AIWG_LIBVIRT_URI``, default ``qemu:///system``): as root it starts ``virtlogd`` and
  ``libvirtd`` when nothing answers (systemd is not PID 1 everywhere), and builds the tiny guest
  image (``scripts/build-guest-image.py``) when it is missing or outdated; the controller's
  built-in ``tiny-vm`` loadout boots it. A step that fails is reported and the rest still runs
  (hostd then lists the VM runtime as unavailable, with the reason).

Once the controller has the ``dev`` instance, the wrapper makes sure
``$AIWG_STATE_DIR/instances/dev.token`` (0600) holds a working A2A token for it (asking the admin
API for a new one when the file is missing or no longer valid) and prints the file's path, then
the web console's URL and where the admin token to sign in with is (the last lines a person sees).

Run it with the venv's python (``.venv/bin/python scripts/devrun.py``); the children are started
with the same interpreter (``-m agentic_sandbox.hostd.main`` / ``-m agentic_sandbox.controller.main``,
what the entry points run). :func:`supervise` is the wrapper itself, for any number of hostds and
controllers: ``scripts/devcluster.py`` (``make cluster``) runs it with three controllers, beside one
hostd or several (``--hosts``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import busybox_image  # beside this script

from agentic_sandbox.controller.config import load_config, upstream_settings
from agentic_sandbox.proto import dev_hostd_socket

ROOT = Path(__file__).resolve().parent.parent
#: What this wrapper calls itself in its messages (devrun, devcluster).
PROG = Path(sys.argv[0]).stem or "devrun"
STOP_TIMEOUT_S = 15.0
HOSTD_WAIT_S = 10.0
CONTROLLER_WAIT_S = 30.0
LIBVIRT_WAIT_S = 20.0
DEV_TOKEN_WAIT_S = 60.0


def _start(module: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    # process_group=0: a terminal Ctrl-C goes to the wrapper only; it forwards exactly one signal.
    return subprocess.Popen([sys.executable, "-m", module, "--dev"], env=env, cwd=ROOT, process_group=0)


Child = tuple[str, subprocess.Popen[bytes]]


def _stop(*children: Child) -> None:
    """SIGTERM to each at once, then wait for each; SIGKILL to any left after ``STOP_TIMEOUT_S``."""
    for _, proc in children:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for name, proc in children:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"{PROG}: {name} did not stop within {STOP_TIMEOUT_S:g} s; killing it", file=sys.stderr)
            proc.kill()
            proc.wait()


def _wait_for_socket(path: str, hostd: subprocess.Popen[bytes], deadline: float) -> None:
    """Give hostd a moment to listen so the controller's first connect succeeds (it retries anyway)."""
    while time.monotonic() < deadline and hostd.poll() is None and not os.path.exists(path):
        time.sleep(0.05)


def _wait_listening(env: dict[str, str], controller: subprocess.Popen[bytes]) -> None:
    """Until the controller answers /healthz (it has read or written the admin token file by then)."""
    deadline = time.monotonic() + CONTROLLER_WAIT_S
    while time.monotonic() < deadline and controller.poll() is None:
        try:
            with urllib.request.urlopen(f"{_base_url(env)}/healthz", timeout=1):
                return
        except (OSError, urllib.error.URLError):
            time.sleep(0.1)


def podman_env(state_dir: str) -> dict[str, str]:
    """hostd's podman settings for dev mode: a service of its own, storage under the state dir."""
    # podman refuses a run root longer than 50 characters, so it lives in /tmp, named per state dir.
    runroot = f"/tmp/aiwg-podman-{hashlib.sha256(os.path.abspath(state_dir).encode()).hexdigest()[:12]}"
    return {
        "AIWG_PODMAN_SOCKET": os.path.join(os.path.abspath(state_dir), "podman", "podman.sock"),
        "AIWG_PODMAN_SERVICE": "1",
        "AIWG_PODMAN_ROOT": os.path.join(os.path.abspath(state_dir), "podman", "root"),
        "AIWG_PODMAN_RUNROOT": runroot,
        "AIWG_PODMAN_STORAGE_DRIVER": "vfs",
    }


def prepare_podman(env: dict[str, str]) -> None:
    """Give hostd a podman service of its own (see the module docstring), unless one is configured."""
    if env.get("AIWG_PODMAN_SOCKET"):
        return  # configured by hand: used as it is
    if shutil.which("podman") is None or not busybox_image.BUSYBOX.exists():
        print(f"{PROG}: podman or busybox-static missing: no container runtime in dev mode", file=sys.stderr)
        return
    env.update(podman_env(env["AIWG_STATE_DIR"]))
    try:
        busybox_image.ensure(env)
    except (SystemExit, OSError, subprocess.SubprocessError) as exc:
        print(f"{PROG}: the busybox image could not be built: {exc}", file=sys.stderr)


def _libvirt_answers(uri: str) -> bool:
    try:
        import libvirt
    except ImportError:
        return False
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    try:
        libvirt.open(uri).close()
    except libvirt.libvirtError:
        return False
    return True


def _vm_setup(env: dict[str, str]) -> None:
    """Bring libvirt up and build the guest image (see the module docstring); never raises."""
    uri = env.get("AIWG_LIBVIRT_URI", "qemu:///system")
    if not uri.startswith("qemu"):
        return
    if os.geteuid() != 0:
        print(f"{PROG}: VMs need root (qemu:///system); skipping libvirt and the guest image", file=sys.stderr)
        return
    if not _libvirt_answers(uri):
        for daemon in ("virtlogd", "libvirtd"):
            try:
                subprocess.run([daemon, "-d"], check=False, stdin=subprocess.DEVNULL)
            except OSError as exc:
                print(f"{PROG}: cannot start {daemon}: {exc}", file=sys.stderr)
        deadline = time.monotonic() + LIBVIRT_WAIT_S
        while time.monotonic() < deadline and not _libvirt_answers(uri):
            time.sleep(0.1)
    build = [sys.executable, str(ROOT / "scripts" / "build-guest-image.py")]
    if subprocess.run(build, env=env, check=False, stdout=subprocess.DEVNULL).returncode != 0:
        print(f"{PROG}: the guest image could not be built; VM provisions will fail", file=sys.stderr)


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


def _base_url(env: dict[str, str]) -> str:
    # Upstream's LISTEN_ADDR=host:P puts HTTP on P+2 (AIWG_LISTEN wins, as in the controller).
    listen = env.get("AIWG_LISTEN") or upstream_settings(env).get("listen") or "127.0.0.1:8122"
    return f"http://{listen}"


def admin_token(env: dict[str, str]) -> tuple[str, str]:
    """The admin token the controller takes, and where it is: ``AIWG_ADMIN_TOKEN``, the admin token
    file (``<secrets dir>/admin.token`` with upstream's ``SECRETS_DIR``), else the first admin of
    upstream's ``operator-tokens.toml`` given as a token. OSError while none is there (yet)."""
    if env.get("AIWG_ADMIN_TOKEN"):
        return env["AIWG_ADMIN_TOKEN"], "$AIWG_ADMIN_TOKEN"
    config = load_config(env=env, dev=True)
    try:
        return Path(config.admin_token_file).read_text().strip(), config.admin_token_file
    except FileNotFoundError:
        if not config.operator_tokens_file:
            raise
    with open(config.operator_tokens_file, "rb") as fh:
        tables = tomllib.load(fh).get("tokens", [])
    for table in tables:
        if table.get("role") == "admin" and table.get("token"):
            return str(table["token"]), config.operator_tokens_file
    raise FileNotFoundError(f"no admin token in {config.admin_token_file} or {config.operator_tokens_file}")


def ensure_dev_token(env: dict[str, str], state_dir: str) -> None:
    """Write a valid A2A token of the dev instance to <state>/instances/dev.token; print its path."""
    base = _base_url(env)
    token_path = Path(state_dir) / "instances" / "dev.token"
    deadline = time.monotonic() + DEV_TOKEN_WAIT_S
    instance_id = None
    while time.monotonic() < deadline:
        try:
            token, _ = admin_token(env)
            instance_id = _dev_instance_id(base, token)
        except (OSError, ValueError):
            instance_id = None
        if instance_id is not None:
            break
        time.sleep(0.2)
    if instance_id is None:
        print(f"{PROG}: the dev instance did not come up; no dev.token written", file=sys.stderr)
        return
    card = f"{base}/agents/{instance_id}/extendedAgentCard"
    try:
        current = token_path.read_text().strip()
    except OSError:
        current = ""
    if not current or _http("GET", card, current, {"A2A-Version": "1.0"})[0] != 200:
        status, body = _http("POST", f"{base}/api/v2/admin/instances/{instance_id}/a2a-token", token)
        if status != 200:
            print(f"{PROG}: could not issue the dev instance's A2A token ({status})", file=sys.stderr)
            return
        _write_private(token_path, json.loads(body)["token"])
    print(f'dev A2A token: {token_path}  (curl -H "Authorization: Bearer $(cat {token_path})" ...)', flush=True)


def announce(env: dict[str, str], state_dir: str) -> None:
    """The dev token (see :func:`ensure_dev_token`), then the console's URL and how to sign in."""
    ensure_dev_token(env, state_dir)
    base = _base_url(env)
    try:
        _, where = admin_token(env)
    except (OSError, ValueError):
        where = str(Path(state_dir) / "admin-token")
    print(f"web console: {base}/console/  (sign in with the admin token in {where})", flush=True)


Named = list[tuple[str, dict[str, str]]]


def supervise(hostds: Named, controllers: Named, announce: Callable[[], None]) -> int:
    """Start each named hostd with its environment (all at once; its socket is ``AIWG_HOSTD_SOCKET``,
    else the dev one in its ``AIWG_STATE_DIR``), wait until they listen, then start each named
    controller with its environment (each once the one before it listens: the first writes the dev
    admin token file the others read), run ``announce`` in a thread, and wait; stop them all as the
    module docstring says (the controllers, then every hostd). The exit status."""
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt  # leaves the wait below at once

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    running: list[Child] = []  # the hostds
    started: list[Child] = []  # the controllers
    status = 0
    try:
        _vm_setup(hostds[0][1])  # libvirt and the guest image are the machine's, whichever hostd asks
        for name, hostd_env in hostds:
            running.append((name, _start("agentic_sandbox.hostd.main", hostd_env)))
        deadline = time.monotonic() + HOSTD_WAIT_S
        for (_, hostd_env), (_, hostd) in zip(hostds, running, strict=True):
            socket_path = hostd_env.get("AIWG_HOSTD_SOCKET") or dev_hostd_socket(hostd_env["AIWG_STATE_DIR"])
            _wait_for_socket(socket_path, hostd, deadline)
        for index, (name, controller_env) in enumerate(controllers):
            if index:
                _wait_listening(controllers[index - 1][1], started[-1][1])
            started.append((name, _start("agentic_sandbox.controller.main", controller_env)))
        threading.Thread(target=announce, daemon=True).start()
        children = {proc.pid: (name, proc) for name, proc in [*running, *started]}
        while True:
            pid, raw = os.wait()  # the first child to exit ends them all
            if pid in children:
                break
        name, proc = children[pid]
        status = os.waitstatus_to_exitcode(raw)
        proc.returncode = status
        print(f"{PROG}: {name} exited with status {status}; stopping the others", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        # A second Ctrl-C or SIGTERM (``timeout`` signals its whole process group as well as the
        # child) must not cut the clean stop short and orphan hostd.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _stop(*started)
        _stop(*running)
    if stopping:
        return 0
    return 128 - status if status < 0 else status  # a signal -N reads as 128+N, as in a shell


def main() -> int:
    env = dict(os.environ)
    env.setdefault("AIWG_STATE_DIR", str(ROOT / ".run"))
    state_dir = env["AIWG_STATE_DIR"]
    prepare_podman(env)
    return supervise([("hostd", env)], [("controller", env)], lambda: announce(env, state_dir))


if __name__ == "__main__":
    sys.exit(main())
