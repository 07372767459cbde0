"""Configuration: defaults, dev conventions, and refusal of bad values with a named setting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentic_sandbox.hostd.config import PROD_SOCKET, PROD_STATE_DIR, ConfigError, from_env


def test_production_defaults() -> None:
    cfg = from_env({})
    assert cfg.state_dir == PROD_STATE_DIR
    assert cfg.socket_path == PROD_SOCKET
    assert cfg.socket_mode == 0o660
    assert cfg.ring_frames >= 1000 and cfg.ring_bytes >= 4 * 1024 * 1024
    assert not cfg.peer_allowed(12345, 12345)
    assert cfg.peer_allowed(0, 0)


def test_dev_defaults_follow_the_state_dir(tmp_path) -> None:
    cfg = from_env({"AIWG_STATE_DIR": str(tmp_path)}, dev=True)
    assert cfg.socket_path == str(tmp_path / "hostd.sock")
    assert cfg.peer_allowed(os.getuid(), 99999)


def test_dev_without_overrides_uses_dot_run(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = from_env({}, dev=True)
    assert cfg.state_dir == str(tmp_path / ".run")
    assert cfg.socket_path == str(tmp_path / ".run" / "hostd.sock")


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"AIWG_RING_FRAMES": "ten"}, "AIWG_RING_FRAMES"),
        ({"AIWG_RING_FRAMES": "3"}, "AIWG_RING_FRAMES"),
        ({"AIWG_RING_BYTES": "-1"}, "AIWG_RING_BYTES"),
        ({"AIWG_HOSTD_SOCKET_MODE": "666"}, "AIWG_HOSTD_SOCKET_MODE"),
        ({"AIWG_HOSTD_SOCKET_MODE": "9"}, "AIWG_HOSTD_SOCKET_MODE"),
        ({"AIWG_STOP_GRACE_S": "forever"}, "AIWG_STOP_GRACE_S"),
        ({"AIWG_STOP_GRACE_S": "99999"}, "AIWG_STOP_GRACE_S"),
        ({"AIWG_HOSTD_ALLOW_UIDS": "root"}, "AIWG_HOSTD_ALLOW_UIDS"),
        ({"AIWG_CGROUP_ROOT": "relative/path"}, "AIWG_CGROUP_ROOT"),
        ({"AIWG_WORKSPACE_ROOT": "/does/not/exist"}, "AIWG_WORKSPACE_ROOT"),
        ({"AIWG_HOSTD_SOCKET": "/tmp/" + "x" * 200}, "AIWG_HOSTD_SOCKET"),
        ({"AIWG_PODMAN_SOCKET": "ssh://root@host/run/podman.sock"}, "AIWG_PODMAN_SOCKET"),
        ({"AIWG_PODMAN_SOCKET": "tcp://127.0.0.1:8888"}, "AIWG_PODMAN_SOCKET"),
        ({"AIWG_PODMAN_SOCKET": "relative.sock"}, "AIWG_PODMAN_SOCKET"),
        ({"AIWG_PODMAN_SOCKET": "unix://relative.sock"}, "AIWG_PODMAN_SOCKET"),
        ({"AIWG_PODMAN_SERVICE": "1"}, "AIWG_PODMAN_SERVICE"),  # a service needs a socket to listen on
        ({"AIWG_PODMAN_SOCKET": "/run/p.sock", "AIWG_PODMAN_SERVICE": "maybe"}, "AIWG_PODMAN_SERVICE"),
        ({"AIWG_PODMAN_ROOT": "relative"}, "AIWG_PODMAN_ROOT"),
        ({"AIWG_PODMAN_RUNROOT": "/tmp/" + "r" * 60}, "AIWG_PODMAN_RUNROOT"),
        ({"AIWG_PODMAN_STORAGE_DRIVER": "vfs; rm"}, "AIWG_PODMAN_STORAGE_DRIVER"),
        ({"AIWG_CONTAINER_NOFILE": "8"}, "AIWG_CONTAINER_NOFILE"),
        ({"AIWG_CONTAINER_NPROC": "many"}, "AIWG_CONTAINER_NPROC"),
    ],
)
def test_bad_values_are_refused_by_name(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        from_env(env)


def test_allow_lists_parse() -> None:
    cfg = from_env({"AIWG_HOSTD_ALLOW_UIDS": "1000, 1001", "AIWG_HOSTD_ALLOW_GIDS": "50"})
    assert cfg.peer_allowed(1001, 7)
    assert cfg.peer_allowed(7, 50)
    assert not cfg.peer_allowed(7, 7)


def test_socket_group_members_are_allowed() -> None:
    cfg = from_env({"AIWG_HOSTD_SOCKET_GROUP": "root"})
    assert cfg.peer_allowed(4242, 0)
    with pytest.raises(ConfigError, match="AIWG_HOSTD_SOCKET_GROUP"):
        from_env({"AIWG_HOSTD_SOCKET_GROUP": "no-such-group-here"})


def test_podman_socket_is_a_unix_url() -> None:
    assert from_env({}).podman_socket == ""
    assert from_env({"AIWG_PODMAN_SOCKET": "/run/p.sock"}).podman_socket == "unix:///run/p.sock"
    assert from_env({"AIWG_PODMAN_SOCKET": "unix:///run/p.sock"}).podman_socket == "unix:///run/p.sock"


def test_podman_service_settings() -> None:
    cfg = from_env({})
    assert (cfg.podman_service, cfg.podman_root, cfg.container_nofile, cfg.container_nproc) == (False, "", 4096, 4096)
    cfg = from_env(
        {
            "AIWG_PODMAN_SOCKET": "/run/p.sock",
            "AIWG_PODMAN_SERVICE": "1",
            "AIWG_PODMAN_ROOT": "/var/lib/p",
            "AIWG_PODMAN_RUNROOT": "/run/p",
            "AIWG_PODMAN_STORAGE_DRIVER": "vfs",
            "AIWG_CONTAINER_NOFILE": "1024",
        }
    )
    assert (cfg.podman_service, cfg.podman_root, cfg.podman_runroot, cfg.podman_storage_driver) == (
        True,
        "/var/lib/p",
        "/run/p",
        "vfs",
    )
    assert cfg.container_nofile == 1024


def test_vm_settings() -> None:
    prod = from_env({})
    assert (prod.libvirt_uri, prod.vm_domain_type) == ("qemu:///system", "kvm")
    assert prod.guest_image_dir == Path("/var/cache/agentic-sandbox/guest-image")
    # Dev mode (and the tests, which run it) emulate: KVM guests hang on some hosts.
    assert from_env({}, dev=True).vm_domain_type == "qemu"
    assert from_env({"AIWG_VM_DOMAIN_TYPE": "kvm"}, dev=True).vm_domain_type == "kvm"
    assert from_env({"AIWG_LIBVIRT_URI": ""}).libvirt_uri == ""
    assert from_env({"AIWG_LIBVIRT_URI": "test:///default"}).libvirt_uri == "test:///default"
    assert from_env({"AIWG_VM_IMAGE_DIR": "/srv/img"}).guest_image_dir == Path("/srv/img")
    for env, named in (
        ({"AIWG_LIBVIRT_URI": "xen:///system"}, "AIWG_LIBVIRT_URI"),
        ({"AIWG_VM_DOMAIN_TYPE": "hvf"}, "AIWG_VM_DOMAIN_TYPE"),
        ({"AIWG_VM_IMAGE_DIR": "relative"}, "AIWG_VM_IMAGE_DIR"),
    ):
        with pytest.raises(ConfigError, match=named):
            from_env(env)
