"""Upstream's ``operator-tokens.toml``: what it may hold, and a real controller reloading it on SIGHUP."""

from __future__ import annotations

import hashlib
import signal
import sqlite3
from pathlib import Path

import httpx
import pytest
import trio

from agentic_sandbox.controller.auth.operatortokens import OperatorTokensError, read_operator_tokens
from tests.controller.conftest import ControllerProcess, LiveHostd

ADMIN = "upstream-admin-" + "a" * 20
OPERATOR = "upstream-operator-" + "o" * 20
LATER = "upstream-later-" + "l" * 20


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_tokens_are_kept_as_digests_with_their_roles(tmp_path: Path) -> None:
    digest = hashlib.sha256(OPERATOR.encode()).hexdigest()
    path = write(
        tmp_path / "operator-tokens.toml",
        f'[[tokens]]\ntoken = "{ADMIN}"\nrole = "admin"\n\n'
        f'[[tokens]]\ntoken_sha256 = "{digest}"\nrole = "operator"\nlabel = "ci-bot"\n',
    )
    admin, operator = read_operator_tokens(str(path))
    assert (admin.role, admin.label, admin.hash) == ("admin", "admin-1", hashlib.sha256(ADMIN.encode()).hexdigest())
    assert (operator.role, operator.label, operator.hash) == ("operator", "ci-bot", digest)
    assert read_operator_tokens(str(tmp_path / "absent.toml")) == [] and read_operator_tokens(None) == []


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[[tokens]]\ntoken = "short"\nrole = "admin"\n', "at least 16"),
        (f'[[tokens]]\ntoken = "{ADMIN}"\nrole = "root"\n', "role must be"),
        (f'[[tokens]]\ntoken = "{ADMIN}"\nrole = "admin"\nscope = "all"\n', "unknown key(s) scope"),
        (f'[[tokens]]\ntoken = "{ADMIN}"\ntoken_sha256 = "{"0" * 64}"\nrole = "admin"\n', "one of token"),
        ('[[tokens]]\ntoken_sha256 = "XYZ"\nrole = "admin"\n', "64 lowercase hex"),
        (f'[[tokens]]\ntoken = "{ADMIN}"\nrole = "admin"\n[[tokens]]\ntoken = "{ADMIN}"\nrole = "operator"\n', "twice"),
        (f'admin = "{ADMIN}"\n', "only [[tokens]]"),
        ("[[tokens]\n", "not valid TOML"),
    ],
)
def test_a_wrong_file_is_refused_naming_what_is_wrong(tmp_path: Path, text: str, says: str) -> None:
    path = write(tmp_path / "operator-tokens.toml", text)
    with pytest.raises(OperatorTokensError, match=r".*") as caught:
        read_operator_tokens(str(path))
    assert str(path) in str(caught.value) and says in str(caught.value)


async def status(url: str, token: str, path: str = "/api/v2/admin/instances") -> int:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as client:
        return (await client.get(path)).status_code


async def test_sighup_reloads_the_file_at_once_and_a_wrong_file_changes_nothing(
    hostd: LiveHostd, tmp_path: Path
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    tokens = write(
        secrets / "operator-tokens.toml",
        f'[[tokens]]\ntoken = "{ADMIN}"\nrole = "admin"\n[[tokens]]\ntoken = "{OPERATOR}"\nrole = "operator"\n',
    )
    env = {"SECRETS_DIR": str(secrets), "AIWG_STATE_DIR": str(tmp_path / "state"), "AIWG_LISTEN": "127.0.0.1:0"}
    env["AIWG_HOSTD_SOCKET"] = hostd.socket_path
    controller = ControllerProcess(env)
    async with trio.open_nursery() as nursery:
        url = await controller.start(nursery)
        # No admin.token beside it: the file's admin is the admin.
        assert await status(url, ADMIN) == 200 and await status(url, OPERATOR) == 200
        assert await status(url, OPERATOR, "/api/v2/admin/logs") == 403  # logs are the admin's
        assert await status(url, LATER) == 401

        write(
            tokens, f'[[tokens]]\ntoken = "{ADMIN}"\nrole = "admin"\n[[tokens]]\ntoken = "{LATER}"\nrole = "operator"\n'
        )
        assert controller.proc is not None
        controller.proc.send_signal(signal.SIGHUP)
        with trio.fail_after(10):
            await controller.wait_line(r"(SIGHUP: operator tokens reloaded .*1 operator)")
        assert await status(url, OPERATOR) == 401 and await status(url, LATER) == 200

        write(tokens, f'[[tokens]]\ntoken = "{LATER}"\nrole = "operator"\n')  # would leave no admin
        controller.proc.send_signal(signal.SIGHUP)
        with trio.fail_after(10):
            said = await controller.wait_line(r"SIGHUP: kept the tokens in use: (.*)")
        assert "names no admin" in said
        assert await status(url, ADMIN) == 200 and await status(url, LATER) == 200

        # Digests only: no token is written anywhere in the store.
        db = tmp_path / "state" / "controller.db"
        rows = sqlite3.connect(db).execute("SELECT hash, role, source FROM tokens ORDER BY role").fetchall()
        assert [(role, source) for _, role, source in rows] == [
            ("admin", "operator-tokens"),
            ("operator", "operator-tokens"),
        ]
        assert {h for h, _, _ in rows} == {hashlib.sha256(t.encode()).hexdigest() for t in (ADMIN, LATER)}
        stored = b"".join(p.read_bytes() for p in db.parent.glob("controller.db*"))
        assert not any(t.encode() in stored for t in (ADMIN, OPERATOR, LATER))
        assert await controller.stop() == 0
