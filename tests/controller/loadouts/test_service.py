"""LoadoutService on real files, then the admin routes over real HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx
import msgspec
import pytest
import trio

from agentic_sandbox.controller.loadouts.service import LoadoutExists, LoadoutInvalid, LoadoutService, parse_manifest
from tests.controller.conftest import OPERATOR_TOKEN, LiveController, LiveHostd, provision

MANIFEST = """\
name: reviewer
version: 2
runtime: host
description: Reads its task and answers.
command: [/usr/bin/env, python3, -c, "import sys; print(sys.stdin.read())"]
"""


@pytest.fixture
def service(tmp_path: Path) -> LoadoutService:
    return LoadoutService(tmp_path / "loadouts")


def test_builtins(service: LoadoutService) -> None:
    names = [lo.name for lo in service.list()]
    assert names[:6] == ["busybox", "claude-code", "echo", "prompt", "shell", "tiny-vm"]
    busybox = service.get("busybox")
    assert busybox is not None and busybox.runtime == "docker" and busybox.image == "localhost/busybox:latest"
    assert msgspec.to_builtins(busybox.view())["compatibility"][0]["runtime_kind"] == "container"
    echo = service.get("echo")
    assert echo is not None and echo.builtin and echo.command == ["/bin/cat"] and echo.runtime == "host"
    shell = service.get("shell")
    assert shell is not None and shell.command[0] == "/bin/sh"
    assert service.get("nope") is None
    view = msgspec.to_builtins(echo.view())
    assert view["compatibility"][0]["runtime_kind"] == "host" and "manifest" not in view
    assert "manifest" in msgspec.to_builtins(echo.view(with_manifest=True))


async def test_create_persists_and_refuses_duplicates(tmp_path: Path, service: LoadoutService) -> None:
    created = await service.create(MANIFEST)
    assert created.name == "reviewer" and created.manifest.version == "2" and not created.builtin
    assert (tmp_path / "loadouts" / "reviewer.yaml").read_text() == MANIFEST
    # The derived compatibility entry names the runtime kind.
    assert created.view().compatibility[0].runtime_kind == "host"
    with pytest.raises(LoadoutExists):
        await service.create(MANIFEST)
    with pytest.raises(LoadoutExists):
        await service.create("version: '1'\nruntime: host\ncommand: [/bin/true]\n", name="echo")
    # A new service (a restarted controller) sees it.
    again = LoadoutService(tmp_path / "loadouts")
    reloaded = again.get("reviewer")
    assert reloaded is not None and reloaded.command == created.command


async def test_concurrent_creates_one_wins(service: LoadoutService) -> None:
    results: list[str] = []

    async def create() -> None:
        try:
            await service.create(MANIFEST)
            results.append("ok")
        except LoadoutExists:
            results.append("exists")

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(create)
    assert sorted(results) == ["exists"] * 4 + ["ok"]


async def test_name_from_request(service: LoadoutService) -> None:
    text = "version: '1'\nruntime: docker\ncommand: [agent]\n"
    lo = await service.create(text, name="from-request")
    assert lo.name == "from-request" and lo.view().compatibility[0].runtime_kind == "container"
    with pytest.raises(LoadoutInvalid) as info:
        await service.create(MANIFEST, name="other-name")
    assert info.value.field == "name"
    with pytest.raises(LoadoutInvalid) as info:
        await service.create(text, name="Bad_Name")
    assert info.value.field == "name"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: [unclosed", "manifest"),
        ("- a list\n", "manifest"),
        ("a: &x [1]\nb: *x\n", "manifest"),
        ("name: ok-name\nversion: '1'\nruntime: host\n", "manifest.command"),
        ("name: ok-name\nversion: '1'\nruntime: lxc\ncommand: [x]\n", "manifest.runtime"),
        ("name: ok-name\nversion: '1'\nruntime: host\ncommand: []\n", "manifest.command"),
        ("name: ok-name\nversion: '1'\nruntime: host\ncommand: [1]\n", "manifest.command[0]"),
        ("name: ok-name\nversion: '1'\nruntime: host\ncommand: [x]\ncomand: [y]\n", "manifest.comand"),
        ("name: X\nversion: '1'\nruntime: host\ncommand: [x]\n", "manifest.name"),
        (
            "name: ok-name\nversion: '1'\nruntime: host\ncommand: [x]\n"
            "runtime_options: {launch_strategy: {mode: hot}}\n",
            "manifest.runtime_options.launch_strategy.mode",
        ),
        (
            "name: ok-name\nversion: '1'\nruntime: host\ncommand: [x]\n"
            "runtime_options: {required_capabilities: [a, a]}\n",
            "manifest.runtime_options.required_capabilities",
        ),
        ("name: ok-name\nversion: '1'\nruntime: host\ncommand: [x]\n" + "#" * 70000, "manifest"),
    ],
)
def test_invalid_manifests_name_the_field(text: str, field: str) -> None:
    with pytest.raises(LoadoutInvalid) as info:
        parse_manifest(text)
    assert info.value.field == field, info.value.message


def test_bad_user_files_are_skipped(tmp_path: Path) -> None:
    directory = tmp_path / "loadouts"
    directory.mkdir()
    (directory / "broken.yaml").write_text("name: [")
    (directory / "echo.yaml").write_text("version: '1'\nruntime: host\ncommand: [/bin/false]\n")
    (directory / "good.yaml").write_text("version: '1'\nruntime: host\ncommand: [/bin/true]\n")
    service = LoadoutService(directory)
    assert service.get("broken") is None
    echo = service.get("echo")
    assert echo is not None and echo.builtin  # a file cannot shadow a built-in
    good = service.get("good")
    assert good is not None and good.command == ["/bin/true"]


# -- the admin routes over real HTTP ---------------------------------------------------------------


async def test_routes(controller: LiveController, admin: httpx.AsyncClient, hostd: LiveHostd) -> None:
    r = await admin.get("/api/v2/admin/loadouts")
    assert r.status_code == 200
    items = {item["name"]: item for item in r.json()["items"]}
    assert items["echo"]["command"] == ["/bin/cat"] and items["echo"]["builtin"] is True
    assert items["shell"]["runtime"] == "host" and "manifest" not in items["shell"]

    r = await admin.post("/api/v2/admin/loadouts", json={"name": "reviewer", "manifest": MANIFEST})
    assert r.status_code == 201, r.text
    assert r.json()["manifest"] == MANIFEST and r.json()["version"] == "2" and r.json()["builtin"] is False

    yaml_body = "name: yaml-one\nversion: '1'\nruntime: host\ncommand: [/bin/cat]\n"
    r = await admin.post("/api/v2/admin/loadouts", content=yaml_body, headers={"Content-Type": "application/x-yaml"})
    assert r.status_code == 201 and r.json()["name"] == "yaml-one"

    for body in ({"name": "reviewer", "manifest": MANIFEST}, {"name": "echo", "manifest": "version: '1'"}):
        r = await admin.post("/api/v2/admin/loadouts", json=body)
        assert r.status_code == 409 and r.json()["code"] == "loadout.already_exists", r.text

    invalid = [
        ({"json": {"name": "x1", "manifest": "a: [b"}}, "manifest"),
        ({"json": {"name": "x1", "manifest": "version: '1'\nruntime: host\ncommand: nope\n"}}, "manifest.command"),
        ({"json": {"name": "Bad", "manifest": "version: '1'"}}, "name"),
        ({"json": {"name": "x1"}}, "manifest"),
        ({"json": {"name": "x1", "manifest": "", "more": 1}}, "more"),
        ({"content": b"\xff\xfe", "headers": {"Content-Type": "application/x-yaml"}}, "manifest"),
        ({"content": b"version: '1'\n", "headers": {"Content-Type": "text/yaml"}}, "manifest.name"),
    ]
    for kwargs, field in invalid:
        r = await admin.post("/api/v2/admin/loadouts", **kwargs)
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "validation.failed" and r.json()["errors"][0]["field"] == field, r.text
    r = await admin.post("/api/v2/admin/loadouts", content=b"x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and r.headers["content-type"] == "application/problem+json"

    async with controller.client(OPERATOR_TOKEN) as operator:
        assert (await operator.get("/api/v2/admin/loadouts")).status_code == 200
        r = await operator.post("/api/v2/admin/loadouts", json={"name": "op-made", "manifest": MANIFEST})
        assert r.status_code == 403 and r.json()["code"] == "auth.forbidden"
    async with controller.client(None) as anon:
        assert (await anon.get("/api/v2/admin/loadouts")).status_code == 401

    names = [item["name"] for item in (await admin.get("/api/v2/admin/loadouts")).json()["items"]]
    assert names == ["busybox", "claude-code", "echo", "prompt", "shell", "tiny-vm", "reviewer", "yaml-one"]


async def test_provisioning_supervises_the_loadout_service_not_its_command(
    admin: httpx.AsyncClient, hostd: LiveHostd
) -> None:
    """A loadout's ``service`` becomes the instance's main process; its ``command`` is per task."""
    manifest = "version: '1'\nruntime: host\ncommand: [/bin/cat]\nservice: [/bin/sleep, '300']\n"
    r = await admin.post("/api/v2/admin/loadouts", json={"name": "sleepy", "manifest": manifest})
    assert r.status_code == 201
    assert r.json()["service"] == ["/bin/sleep", "300"]
    op = await provision(admin, "uses-sleepy", loadout="sleepy", start=True)
    (info,) = [i for i in await hostd.instances() if i.instance_id == op["result"]["instance_id"]]
    assert info.command == ["/bin/sleep", "300"] and info.loadout == "sleepy" and info.state == "running"
    # The built-in echo agent has no service: its instance runs, with nothing supervised.
    op = await provision(admin, "uses-echo", loadout="echo", start=True)
    (info,) = [i for i in await hostd.instances() if i.instance_id == op["result"]["instance_id"]]
    assert info.command is None and info.state == "running"
    r = await admin.post("/api/v2/admin/instances", json={"name": "uses-nothing", "runtime": "host", "loadout": "nope"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "loadout"
