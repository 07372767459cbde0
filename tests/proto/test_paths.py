"""Where hostd's socket is: one definition for hostd, the controller and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentic_sandbox.proto import DEV_STATE_DIR, PROD_HOSTD_SOCKET, dev_hostd_socket, find_hostd_socket


def test_dev_socket_is_in_the_state_dir() -> None:
    assert dev_hostd_socket() == ".run/hostd.sock"
    assert dev_hostd_socket("/srv/state") == "/srv/state/hostd.sock"
    assert DEV_STATE_DIR == ".run"
    assert PROD_HOSTD_SOCKET == "/run/agentic-sandbox/hostd.sock"


def test_find_prefers_the_variable_then_a_dev_hostd_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert find_hostd_socket({"AIWG_HOSTD_SOCKET": "/x.sock"}) == "/x.sock"
    assert find_hostd_socket({"AIWG_HOSTD_SOCKET": ""}) == PROD_HOSTD_SOCKET  # empty is unset
    assert find_hostd_socket({}) == PROD_HOSTD_SOCKET
    (tmp_path / ".run").mkdir()
    (tmp_path / ".run" / "hostd.sock").touch()
    assert find_hostd_socket({}) == str(tmp_path / ".run" / "hostd.sock")
    assert find_hostd_socket({"AIWG_HOSTD_SOCKET": "/x.sock"}) == "/x.sock"
    monkeypatch.setenv("AIWG_HOSTD_SOCKET", "/from/environ.sock")
    assert find_hostd_socket() == "/from/environ.sock"
