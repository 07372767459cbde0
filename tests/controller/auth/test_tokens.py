"""Bearer tokens: hashing, constant-time lookup, the admin token file, and every auth case over HTTP."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest

from agentic_sandbox.controller.auth.tokens import Authenticator, config_tokens, hash_token, resolve_admin_token
from agentic_sandbox.controller.config import ConfigError, load_config

from ..a2a.helpers import new_agent
from ..conftest import ADMIN_TOKEN, OPERATOR_TOKEN, LiveController, provision
from ..http.test_problems import assert_problem


def test_authenticator_maps_tokens_to_roles() -> None:
    config = load_config(env={"AIWG_ADMIN_TOKEN": ADMIN_TOKEN, "AIWG_OPERATOR_TOKEN": OPERATOR_TOKEN}, dev=True)
    auth = Authenticator(config_tokens(config, ADMIN_TOKEN))
    assert auth.authenticate(f"Bearer {ADMIN_TOKEN}").role == "admin"  # type: ignore[union-attr]
    assert auth.authenticate(f"bearer   {OPERATOR_TOKEN}").role == "operator"  # type: ignore[union-attr]
    for bad in (None, "", "Bearer", "Bearer ", f"Basic {ADMIN_TOKEN}", f"Bearer {ADMIN_TOKEN}x", ADMIN_TOKEN):
        assert auth.authenticate(bad) is None


def test_only_hashes_are_kept() -> None:
    config = load_config(env={"AIWG_ADMIN_TOKEN": ADMIN_TOKEN}, dev=True)
    records = config_tokens(config, ADMIN_TOKEN)
    assert [r.hash for r in records] == [hash_token(ADMIN_TOKEN)]
    assert ADMIN_TOKEN not in repr(records)


def test_dev_token_file_is_written_once_with_mode_0600(tmp_path: Path) -> None:
    config = load_config(env={"AIWG_STATE_DIR": str(tmp_path / "s")}, dev=True)
    token = resolve_admin_token(config)
    path = Path(config.admin_token_file)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text().strip() == token
    assert resolve_admin_token(config) == token  # reused, not rotated


def test_production_needs_a_token(tmp_path: Path) -> None:
    config = load_config(env={"AIWG_STATE_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match="AIWG_ADMIN_TOKEN"):
        resolve_admin_token(config)
    Path(config.admin_token_file).write_text("short\n")
    with pytest.raises(ConfigError, match="at least 16"):
        resolve_admin_token(config)
    Path(config.admin_token_file).write_text("f" * 30 + "\n")
    assert resolve_admin_token(config) == "f" * 30


async def test_env_token_wins_over_the_file(tmp_path: Path) -> None:
    config = load_config(env={"AIWG_STATE_DIR": str(tmp_path), "AIWG_ADMIN_TOKEN": ADMIN_TOKEN}, dev=True)
    assert resolve_admin_token(config) == ADMIN_TOKEN
    assert not Path(config.admin_token_file).exists()


# -- over HTTP -------------------------------------------------------------------------------


async def test_missing_and_wrong_tokens_are_401_with_challenge(controller: LiveController) -> None:
    for headers in ({}, {"Authorization": "Bearer nope-nope-nope"}, {"Authorization": f"Basic {ADMIN_TOKEN}"}):
        async with httpx.AsyncClient(base_url=controller.url, headers=headers) as client:
            for method, path in (
                ("GET", "/api/v2/admin/instances"),
                ("POST", "/api/v2/admin/instances"),
                ("GET", "/api/v2/admin/operations/op_x"),
                ("GET", "/api/v2/admin/deprecation/v1-counters"),
                ("GET", "/api/v1/vms"),
            ):
                response = await client.request(method, path)
                assert_problem(response, 401, "auth.unauthorized")
                assert response.headers["WWW-Authenticate"] == "Bearer"


async def test_observability_needs_no_token(anon: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await anon.get(path)).status_code == 200


async def test_operator_reads_and_operates_but_may_not_provision_or_destroy(
    admin: httpx.AsyncClient, operator: httpx.AsyncClient
) -> None:
    op = await provision(admin, "auth-target", start=True)
    iid = op["result"]["instance_id"]

    assert (await operator.get("/api/v2/admin/instances")).status_code == 200
    assert (await operator.get(f"/api/v2/admin/instances/{iid}")).status_code == 200
    assert (await operator.get(f"/api/v2/admin/operations/{op['id']}")).status_code == 200
    assert (await operator.get("/api/v2/admin/deprecation/v1-counters")).status_code == 200
    stop = await operator.post(f"/api/v2/admin/instances/{iid}/stop")
    assert stop.status_code == 202

    denied = [
        ("POST", "/api/v2/admin/instances", {"name": "nope-1", "runtime": "host"}),
        ("POST", f"/api/v2/admin/instances/{iid}/destroy", None),
        ("DELETE", f"/api/v2/admin/instances/{iid}", None),
        ("POST", f"/api/v2/admin/instances/{iid}/reprovision", None),
    ]
    for method, path, body in denied:
        response = await operator.request(method, path, json=body)
        problem = assert_problem(response, 403, "auth.forbidden")
        assert "operator" in problem["detail"]


async def test_admin_may_do_everything(admin: httpx.AsyncClient) -> None:
    op = await provision(admin, "auth-admin")
    iid = op["result"]["instance_id"]
    assert (await admin.post(f"/api/v2/admin/instances/{iid}/destroy")).status_code == 202


async def test_the_store_holds_no_plaintext_token(controller: LiveController) -> None:
    data = b"".join(p.read_bytes() for p in Path(controller.config.state_dir).glob("controller.db*"))
    assert ADMIN_TOKEN.encode() not in data
    assert OPERATOR_TOKEN.encode() not in data
    assert hash_token(ADMIN_TOKEN).encode() in data


async def test_an_instance_token_sees_its_own_instance_and_nothing_of_another(
    controller: LiveController, admin: httpx.AsyncClient
) -> None:
    """What the web console needs for an instance token: its own catalog entry and PTY sessions on
    the admin routes; another instance is a 404 worded as for one that does not exist; every other
    admin route stays closed to it (403)."""
    mine = await new_agent(admin, controller, "token-mine")
    other = await new_agent(admin, controller, "token-other")
    theirs = await admin.post(f"/api/v2/admin/instances/{other.instance_id}/sessions", json={"argv": ["/bin/cat"]})
    assert theirs.status_code == 201, theirs.text
    their_sid = theirs.json()["id"]
    missing = "0190a000-0000-7000-8000-000000000000"
    async with controller.client(mine.token) as client:
        listed = await client.get("/api/v2/admin/instances")
        assert listed.status_code == 200, listed.text
        assert [item["id"] for item in listed.json()["items"]] == [mine.instance_id]
        assert (await client.get("/api/v2/admin/instances", params={"state": "running"})).json()["items"][0]["id"] == (
            mine.instance_id
        )
        assert (await client.get(f"/api/v2/admin/instances/{mine.instance_id}")).json()["name"] == "token-mine"

        sessions = f"/api/v2/admin/instances/{mine.instance_id}/sessions"
        created = await client.post(sessions, json={"argv": ["/bin/cat"], "size": {"cols": 90, "rows": 20}})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        assert [s["id"] for s in (await client.get(sessions)).json()["items"]] == [sid]
        assert (await client.get(f"{sessions}/{sid}")).json()["cols"] == 90
        assert (await client.delete(f"{sessions}/{sid}")).status_code == 204

        # Another instance, and one that does not exist, answer alike: nothing tells them apart.
        for iid in (other.instance_id, missing):
            base = f"/api/v2/admin/instances/{iid}"
            answers = [
                await client.get(base),
                await client.get(f"{base}/sessions"),
                await client.post(f"{base}/sessions", json={"argv": ["/bin/true"]}),
                await client.get(f"{base}/sessions/{their_sid}"),
                await client.delete(f"{base}/sessions/{their_sid}"),
            ]
            for response in answers:
                problem = assert_problem(response, 404, "instance.not_found")
                assert problem["detail"] == f"no instance with id {iid!r}"
        # The other instance's session under this token's own instance is not found either.
        assert_problem(await client.get(f"{sessions}/{their_sid}"), 404, "session.not_found")

        for method, path in (
            ("GET", "/api/v2/admin/events"),
            ("GET", "/api/v2/admin/logs"),
            ("GET", "/api/v2/admin/loadouts"),
            ("POST", f"/api/v2/admin/instances/{mine.instance_id}/stop"),
            ("POST", "/api/v2/admin/instances"),
        ):
            assert_problem(await client.request(method, path), 403, "auth.forbidden")
        # The v1 paths answer through the same handlers: the same narrowing.
        assert [item["id"] for item in (await client.get("/api/v1/vms")).json()["items"]] == [mine.instance_id]
    # The other instance's shell was never touched.
    assert (await admin.get(f"/api/v2/admin/instances/{other.instance_id}/sessions/{their_sid}")).json()["state"] == (
        "running"
    )
