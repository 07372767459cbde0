"""The systemd units, sysusers.d/tmpfiles.d snippets and their installer.

systemd is not PID 1 here, so units are checked offline: installed by scripts/install-units.sh
into a staging root, then `systemd-analyze verify` (which needs the ExecStart binaries to
exist: the installer points them at stand-ins) and `systemd-analyze security --offline`.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UNITS = REPO / "systemd"
INSTALL = REPO / "scripts" / "install-units.sh"
HOSTD = "agentic-hostd.service"
CONTROLLER = "agentic-controller.service"

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")


def directives(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Section -> (key, value) in order; keys may repeat (Environment=)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            sections.setdefault(current, [])
            continue
        key, _, value = line.partition("=")
        sections[current].append((key.strip(), value.strip()))
    return sections


def values(path: Path, section: str, key: str) -> list[str]:
    return [v for k, v in directives(path).get(section, []) if k == key]


def one(path: Path, section: str, key: str) -> str:
    found = values(path, section, key)
    assert len(found) == 1, f"{path.name}: [{section}] {key}= appears {len(found)} times"
    return found[0]


def environment(path: Path) -> dict[str, str]:
    return dict(v.split("=", 1) for v in values(path, "Service", "Environment"))


@pytest.fixture
def staged(tmp_path: Path) -> Path:
    """The units installed with DESTDIR into tmp_path, ExecStart pointing at stand-in binaries."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("agentic-hostd", "agentic-controller"):
        (bindir / name).write_text("#!/bin/sh\nexit 0\n")
        (bindir / name).chmod(0o755)
    root = tmp_path / "root"
    result = subprocess.run(
        ["bash", str(INSTALL)],
        env={**os.environ, "DESTDIR": str(root), "BINDIR": str(bindir)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "DESTDIR is set: skipped systemd-sysusers" in result.stdout
    return root


# -- the installer ------------------------------------------------------------------------------


def test_install_layout(staged: Path, tmp_path: Path) -> None:
    unitdir = staged / "etc/systemd/system"
    for unit in (HOSTD, CONTROLLER):
        installed = unitdir / unit
        assert stat.S_IMODE(installed.stat().st_mode) == 0o644
        binary = unit.removesuffix(".service")
        assert one(installed, "Service", "ExecStart") == f"{tmp_path}/bin/{binary}"
        # Nothing but ExecStart differs from the source.
        strip = lambda text: [line for line in text.splitlines() if not line.startswith("ExecStart=")]  # noqa: E731
        assert strip(installed.read_text()) == strip((UNITS / unit).read_text())
    assert (staged / "usr/lib/sysusers.d/agentic-sandbox.conf").read_bytes() == (
        UNITS / "agentic-sandbox.sysusers.conf"
    ).read_bytes()
    assert (staged / "usr/lib/tmpfiles.d/agentic-sandbox.conf").read_bytes() == (
        UNITS / "agentic-sandbox.tmpfiles.conf"
    ).read_bytes()


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="systemd is PID 1: would activate for real")
def test_install_without_systemd_says_what_it_skipped(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PREFIX": str(tmp_path / "usr"),
        "UNITDIR": str(tmp_path / "units"),
    }
    env.pop("DESTDIR", None)
    result = subprocess.run(["bash", str(INSTALL)], env=env, capture_output=True, text=True, check=True)
    assert (tmp_path / "units" / HOSTD).is_file()
    assert (tmp_path / "usr/lib/tmpfiles.d/agentic-sandbox.conf").is_file()
    assert "systemd is not PID 1: skipped systemd-sysusers" in result.stdout
    assert "systemd is not PID 1: skipped systemd-tmpfiles --create" in result.stdout
    assert "systemd is not PID 1: skipped systemctl daemon-reload" in result.stdout
    # The default BINDIR (/usr/bin) has no agentic-hostd here: the installer says so.
    assert "BINDIR" in result.stdout


# -- systemd-analyze ----------------------------------------------------------------------------


@needs_analyze
@pytest.mark.parametrize("unit", [HOSTD, CONTROLLER])
def test_systemd_analyze_verify(staged: Path, unit: str) -> None:
    path = staged / "etc/systemd/system" / unit
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True, check=False
    )
    # verify exits 0 on unknown keys and bad values and only warns: any line about our units fails.
    ours = [line for line in result.stderr.splitlines() if "agentic" in line]
    assert result.returncode == 0, result.stderr
    assert ours == [], result.stderr


@needs_analyze
def test_controller_exposure_is_low(staged: Path) -> None:
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(staged / "etc/systemd/system" / CONTROLLER)],
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"Overall exposure level for \S+: ([\d.]+)", result.stdout)
    assert found, result.stdout + result.stderr
    assert float(found.group(1)) <= 2.0, result.stdout


# -- what the units say -------------------------------------------------------------------------


def test_hostd_unit() -> None:
    unit = UNITS / HOSTD
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "WatchdogSec": "30",
        "Restart": "on-failure",
        "RestartSec": "2",
        "KillMode": "process",
        "Delegate": "yes",
        "RuntimeDirectory": "agentic-sandbox",
        "RuntimeDirectoryPreserve": "yes",
        "StateDirectory": "agentic-sandbox",
        "ExecStart": "/usr/bin/agentic-hostd",
    }
    assert {key: one(unit, "Service", key) for key in expected} == expected
    assert values(unit, "Service", "User") in ([], ["root"])
    env = environment(unit)
    assert env["AIWG_HOSTD_SOCKET_GROUP"] == "agentic-sandbox"
    assert env["AIWG_HOSTD_SOCKET"] == "/run/agentic-sandbox/hostd.sock"
    assert values(unit, "Service", "EnvironmentFile") == ["-/etc/agentic-sandbox/hostd.env"]
    # The reason for KillMode=process is written next to it.
    text = unit.read_text()
    comment = text[: text.index("KillMode=process")].rsplit("\n\n", 1)[-1]
    assert "re-adopted" in comment
    assert "control-group" in comment


def test_controller_unit() -> None:
    unit = UNITS / CONTROLLER
    assert one(unit, "Service", "User") == "agentic-sandbox"
    assert one(unit, "Service", "Group") == "agentic-sandbox"
    assert one(unit, "Service", "ExecStart") == "/usr/bin/agentic-controller"
    assert one(unit, "Service", "ExecReload") == "/bin/kill -HUP $MAINPID"  # operator-tokens.toml again
    assert one(unit, "Service", "Restart") == "on-failure"
    assert one(unit, "Service", "StateDirectory") == "agentic-sandbox-controller"
    assert "agentic-hostd.service" in one(unit, "Unit", "After").split()
    assert "agentic-hostd.service" in one(unit, "Unit", "Wants").split()
    # Restarting either unit must never stop or restart the other.
    for key in ("Requires", "Requisite", "BindsTo", "PartOf", "PropagatesReloadTo", "ReloadPropagatedFrom"):
        assert not any("agentic-hostd" in v for v in values(unit, "Unit", key)), key
    hardening = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "RestrictNamespaces": "yes",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
        "SystemCallFilter": "@system-service",
        "CapabilityBoundingSet": "",
    }
    assert {key: one(unit, "Service", key) for key in hardening} == hardening
    assert values(unit, "Service", "ReadWritePaths") == ["/var/lib/agentic-sandbox-controller"]
    # Both sides agree on the socket.
    assert environment(unit)["AIWG_HOSTD_SOCKET"] == environment(UNITS / HOSTD)["AIWG_HOSTD_SOCKET"]


def test_hostd_unit_does_not_reference_controller() -> None:
    text = (UNITS / HOSTD).read_text()
    assert not any("agentic-controller" in v for _, v in directives(UNITS / HOSTD)["Unit"]), text


# -- sysusers.d and tmpfiles.d, applied to a scratch root -----------------------------------------


@pytest.mark.skipif(
    shutil.which("systemd-sysusers") is None or shutil.which("systemd-tmpfiles") is None or os.geteuid() != 0,
    reason="needs systemd-sysusers, systemd-tmpfiles and root (chown in the scratch root)",
)
def test_sysusers_and_tmpfiles(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    subprocess.run(
        ["systemd-sysusers", f"--root={tmp_path}", str(UNITS / "agentic-sandbox.sysusers.conf")],
        check=True,
        capture_output=True,
    )
    passwd = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc/passwd").read_text().splitlines()}
    group = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc/group").read_text().splitlines()}
    user = passwd["agentic-sandbox"]
    gid = int(group["agentic-sandbox"][2])
    assert int(user[3]) == gid  # the user's primary group is the socket's group
    assert user[5] == "/var/lib/agentic-sandbox-controller"
    assert user[6].endswith("nologin")

    subprocess.run(
        ["systemd-tmpfiles", f"--root={tmp_path}", "--create", str(UNITS / "agentic-sandbox.tmpfiles.conf")],
        check=True,
        capture_output=True,
    )

    def owner(path: str) -> tuple[int, int, int]:
        st = (tmp_path / path.lstrip("/")).stat()
        return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid

    # Exactly what the units' *Directory= settings leave behind, so a restart changes nothing.
    hostd_unit, controller_unit = UNITS / HOSTD, UNITS / CONTROLLER
    assert owner("/run/agentic-sandbox") == (int(one(hostd_unit, "Service", "RuntimeDirectoryMode"), 8), 0, 0)
    assert owner("/var/lib/agentic-sandbox") == (int(one(hostd_unit, "Service", "StateDirectoryMode"), 8), 0, 0)
    uid = int(user[2])
    mode = int(one(controller_unit, "Service", "StateDirectoryMode"), 8)
    assert owner("/var/lib/agentic-sandbox-controller") == (mode, uid, gid)


# -- MemoryDenyWriteExecute does not break the controller's stack --------------------------------

MDWE_CHILD = """
import ctypes, mmap, sys
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
    sys.exit(77)
try:  # prove it is enforced
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    sys.exit("W+X mapping was allowed")
except OSError:
    pass
import sqlite3, trio, msgspec, hypercorn.trio, quart_trio, yaml, jsonschema, prometheus_client, rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
key = Ed25519PrivateKey.generate()
key.public_key().verify(key.sign(b"card"), b"card")
trio.run(trio.sleep, 0)
sqlite3.connect(":memory:").execute("select 1")
from agentic_sandbox import proto
print("ok")
"""


def test_memory_deny_write_execute_keeps_the_controller_stack_working() -> None:
    """prctl(PR_SET_MDWE) is the kernel's own form of MemoryDenyWriteExecute=yes (systemd 252 uses
    seccomp for the same rule: no W+X mappings, no exec gained later)."""
    # A child process: MDWE cannot be undone in the process that sets it.
    result = subprocess.run([sys.executable, "-c", MDWE_CHILD], capture_output=True, text=True, check=False)
    if result.returncode == 77:
        pytest.skip("kernel has no PR_SET_MDWE (Linux < 6.3)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
