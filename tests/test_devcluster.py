"""``make cluster``'s wrapper: a private PostgreSQL server, hostd and three controllers on it start,
the controllers answer as one (what is written at one is read at the others), and a SIGTERM stops
every part of it, the database server last. With ``--hosts 2``: two hostds, each with its state dir,
socket and controllers, both hosts registered in the one database."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from tests.hostd_process import ROOT
from tests.processes import alive
from tests.test_devrun import _free_port, _read_until, cleanup, devrun_podman_env


def _start(tmp_path: Path, ports: list[int], *args: str) -> subprocess.Popen[bytes]:
    env = {
        **{k: v for k, v in os.environ.items() if k != "AIWG_DATABASE_URL"},
        "AIWG_STATE_DIR": str(tmp_path / "run"),
        "AIWG_CGROUP_ROOT": "off",
        "AIWG_LIBVIRT_URI": "",  # no VM setup (libvirt daemons, guest image) for the wrapper's tests
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "devcluster.py"), "--ports", ",".join(map(str, ports)), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _ready(proc: subprocess.Popen[bytes], urls: list[str]) -> tuple[int, dict[str, int]]:
    """Once the wrapper said every controller is ready: the database's port, its children by name."""
    said = _read_until(proc, re.compile(rb"shared state: .*\n"), timeout=90)
    assert proc.poll() is None, said
    for url in urls:
        assert f"{url}   ready: {url}/readyz" in said, said
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    found = re.search(r"database: +postgresql://\S+@127\.0\.0\.1:(\d+)/aiwg", said)
    assert found is not None, said
    children = {}
    for child in psutil.Process(proc.pid).children():
        listen = child.environ().get("AIWG_LISTEN", "")
        children["controller " + listen if "controller.main" in " ".join(child.cmdline()) else "hostd"] = child.pid
    assert len(children) == 4, children  # hostd and three controllers (the database server is pg_ctl's)
    return int(found.group(1)), children


def test_three_controllers_answer_as_one_and_a_sigterm_stops_everything(tmp_path: Path) -> None:
    ports = [_free_port() for _ in range(3)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    proc = _start(tmp_path, ports)
    children: set[int] = set()
    try:
        db_port, named = _ready(proc, urls)
        children = set(named.values())

        token = (tmp_path / "run" / "admin-token").read_text().strip()
        admin = {"Authorization": f"Bearer {token}"}
        listed = [
            [
                (item["id"], item["name"], item["state"], item["created_at"])  # the card URL is each controller's
                for item in httpx.get(f"{url}/api/v2/admin/instances", headers=admin).json()["items"]
            ]
            for url in urls
        ]
        assert [name for _, name, _, _ in listed[0]] == ["dev"]
        assert listed[1] == listed[0] and listed[2] == listed[0]
        # A token issued at the first controller works at the others, the one before it nowhere.
        dev_id = listed[0][0][0]
        old = (tmp_path / "run" / "instances" / "dev.token").read_text().strip()
        issued = httpx.post(f"{urls[0]}/api/v2/admin/instances/{dev_id}/a2a-token", headers=admin)
        assert issued.status_code == 200, issued.text
        new = issued.json()["token"]
        for url in urls[1:]:
            deadline = time.monotonic() + 10
            while True:
                card = [
                    httpx.get(
                        f"{url}/agents/{dev_id}/extendedAgentCard",
                        headers={"Authorization": f"Bearer {t}", "A2A-Version": "1.0"},
                    ).status_code
                    for t in (new, old)
                ]
                if card == [200, 401] or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert card == [200, 401], url

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not alive(children), "a part of make cluster outlived the wrapper"
        assert not _accepts(db_port), "the database server outlived the wrapper"
        assert not (tmp_path / "run" / "hostd.sock").exists()
    finally:
        cleanup(proc, children, tmp_path)


def test_a_controller_that_dies_stops_the_cluster(tmp_path: Path) -> None:
    ports = [_free_port() for _ in range(3)]
    proc = _start(tmp_path, ports)
    children: set[int] = set()
    try:
        db_port, named = _ready(proc, [f"http://127.0.0.1:{port}" for port in ports])
        children = set(named.values())
        os.kill(named[f"controller 127.0.0.1:{ports[1]}"], signal.SIGKILL)
        assert proc.wait(60) == 128 + signal.SIGKILL  # its status, as a shell shows it
        assert not alive(children)
        assert not _accepts(db_port)
    finally:
        cleanup(proc, children, tmp_path)


def test_two_hosts_each_run_their_hostd_and_controllers_and_a_sigterm_stops_everything(tmp_path: Path) -> None:
    ports = [_free_port() for _ in range(3)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    run, second = tmp_path / "run", tmp_path / "run" / "host-2"
    proc = _start(tmp_path, ports, "--hosts", "2")
    children: set[int] = set()
    below: list[psutil.Process] = []  # the hostds' podman services: cleaned up too if the test fails
    try:
        said = _read_until(proc, re.compile(rb"provision on a host .*\n"), timeout=90)
        assert proc.poll() is None, said
        for number, (url, host) in enumerate(zip(urls, [1, 2, 1], strict=True), 1):
            assert f"controller {number} (host {host}): {url}   ready: {url}/readyz" in said, said
            assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
        found = re.search(r"database: +postgresql://\S+@127\.0\.0\.1:(\d+)/aiwg", said)
        assert found is not None, said
        db_port = int(found.group(1))

        hostds: dict[str, int] = {}
        controllers: dict[str, tuple[str, ...]] = {}
        for child in psutil.Process(proc.pid).children():
            children.add(child.pid)
            env = child.environ()
            if "hostd.main" in " ".join(child.cmdline()):
                hostds[env["AIWG_STATE_DIR"]] = child.pid
            else:
                keys = ("AIWG_STATE_DIR", "AIWG_HOSTD_SOCKET", "AIWG_HOST_LABELS", "AIWG_ADMIN_TOKEN_FILE")
                controllers[env["AIWG_LISTEN"]] = tuple(env[key] for key in keys)
        assert sorted(hostds) == [str(run), str(second)]  # the database server is pg_ctl's
        below = [p for pid in hostds.values() for p in psutil.Process(pid).children(recursive=True)]
        token_file = str(run / "admin-token")
        on_host_1 = (str(run), str(run / "hostd.sock"), "host=1", token_file)
        on_host_2 = (str(second), str(second / "hostd.sock"), "host=2", token_file)
        assert controllers == {
            f"127.0.0.1:{ports[0]}": on_host_1,
            f"127.0.0.1:{ports[1]}": on_host_2,
            f"127.0.0.1:{ports[2]}": on_host_1,
        }

        # Both hosts registered, each with its own controllers, seen alike from every controller.
        admin = {"Authorization": f"Bearer {(run / 'admin-token').read_text().strip()}"}
        expected = {"1": sorted([urls[0], urls[2]]), "2": [urls[1]]}
        for url in urls:
            deadline = time.monotonic() + 15
            while True:
                listed = httpx.get(f"{url}/api/v2/admin/hosts", headers=admin, timeout=5)
                assert listed.status_code == 200, listed.text
                hosts = {
                    item["labels"].get("host"): sorted(c["url"] for c in item["controllers"] if c["alive"])
                    for item in listed.json()["items"]
                }
                if hosts == expected or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert len(listed.json()["items"]) == 2, listed.text
            assert hosts == expected, url

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not alive(children), "a part of make cluster outlived the wrapper"
        assert not _accepts(db_port), "the database server outlived the wrapper"
        assert not (run / "hostd.sock").exists() and not (second / "hostd.sock").exists()
    finally:
        cleanup(proc, children, tmp_path)
        for leftover in below:
            with contextlib.suppress(psutil.Error):
                leftover.kill()  # psutil refuses a pid that is another process's by now
        shutil.rmtree(devrun_podman_env(str(second))["AIWG_PODMAN_RUNROOT"], ignore_errors=True)


def test_more_hosts_than_controllers_is_refused(tmp_path: Path) -> None:
    proc = _start(tmp_path, [_free_port(), _free_port()], "--hosts", "3")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert b"--hosts: 3 hosts need 3 controllers at least, one per port of --ports (2 given)" in out, out
    assert not (tmp_path / "run").exists()  # nothing started
