"""A host instance's directory (hostd.providers.host.directory) on real files: which working dir
an instance gets, what its metadata says, removal. agent.env and a child's env through a real
provision: tests/hostd/test_instances.py."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from agentic_sandbox.hostd.errors import RpcError
from agentic_sandbox.hostd.providers.host import directory
from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m


def info(inst_dir: Path, working_dir: str = "/w", **fields: object) -> m.InstanceInfo:
    values: dict[str, object] = {"instance_id": "i-1", "name": "one", "state": "running", "created_at": 1.0}
    return m.InstanceInfo(**(values | fields), instance_dir=str(inst_dir), working_dir=working_dir)  # type: ignore[arg-type]


def test_a_requested_working_dir_is_resolved_to_its_real_path(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert directory.requested_working_dir(str(tmp_path / "link")) == str(tmp_path / "real")
    assert directory.requested_working_dir(f"{tmp_path}/real/../real/") == str(tmp_path / "real")
    assert directory.requested_working_dir(None) == ""


@pytest.mark.parametrize("name", ["relative", "file", "missing"])
def test_a_working_dir_must_be_an_existing_absolute_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "relative").mkdir()
    path = {"relative": "relative", "file": str(tmp_path / "file"), "missing": str(tmp_path / "missing")}[name]
    monkeypatch.chdir(tmp_path)  # "relative" exists from here, and is still refused
    with pytest.raises(RpcError) as refused:
        directory.requested_working_dir(path)
    assert refused.value.code is ErrorCode.WORKING_DIR_NOT_FOUND and refused.value.details == {"working_dir": path}


def test_the_working_dir_is_the_requested_one_else_the_workspace_root_else_work(tmp_path: Path) -> None:
    instances = tmp_path / "instances"
    assert directory.create(instances / "a", "/requested", "/workspace") == "/requested"
    assert directory.create(instances / "b", "", "/workspace") == "/workspace"
    assert not (instances / "a" / "work").exists() and not (instances / "b" / "work").exists()
    assert directory.create(instances / "c", "", "") == str(instances / "c" / "work")
    for path in (instances, instances / "a", instances / "c" / "work"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_metadata_describes_the_instance_and_follows_it(tmp_path: Path) -> None:
    inst_dir = tmp_path / "i-1"
    inst_dir.mkdir()
    running = info(inst_dir, host=m.HostDetail(pid=7, pgid=7, cgroup="/cg"), loadout="demo", labels={"t": "a"})
    directory.write_metadata(running)
    metadata = json.loads((inst_dir / "metadata.json").read_text())
    assert metadata == {
        "instance_id": "i-1",
        "name": "one",
        "runtime": "host",
        "isolation_tier": "full-host-access",
        "isolation_warning": "host instances run with the full access of hostd's user",
        "agent_id": "host-i-1",
        "state": "running",
        "pid": 7,
        "process_group_id": 7,
        "working_dir": "/w",
        "cgroup": "/cg",
        "loadout": "demo",
        "labels": {"t": "a"},
    }
    directory.write_metadata(info(inst_dir, state="stopped"))
    metadata = json.loads((inst_dir / "metadata.json").read_text())
    assert (metadata["state"], metadata["pid"], metadata["cgroup"]) == ("stopped", None, None)


def test_metadata_of_an_instance_whose_dir_is_gone_is_not_written(tmp_path: Path) -> None:
    directory.write_metadata(info(tmp_path / "gone"))
    assert list(tmp_path.iterdir()) == []


def test_agent_values_go_to_agent_env_and_to_every_child(tmp_path: Path) -> None:
    inst_dir = tmp_path / "i-1"
    inst_dir.mkdir()
    inst = info(inst_dir, working_dir=str(tmp_path))
    directory.write_agent_env(inst, {"FOO": "a=b"})
    assert (inst_dir / "agent.env").read_text() == (
        "AIWG_INSTANCE_ID=i-1\nAGENT_INSTANCE_ID=i-1\nAGENT_ID=host-i-1\nFOO=a=b\n"  # no loadout, no line
    )
    env = directory.child_env(inst, {"FOO": "a=b"})
    assert env["USER"] == env["LOGNAME"] and env["USER"]
    assert {k: env[k] for k in ("HOME", "AIWG_INSTANCE_DIR", "AGENT_ID", "FOO")} == {
        "HOME": str(tmp_path),
        "AIWG_INSTANCE_DIR": str(inst_dir),
        "AGENT_ID": "host-i-1",
        "FOO": "a=b",
    }


def test_remove_takes_the_whole_tree_and_tolerates_none(tmp_path: Path) -> None:
    inst_dir = tmp_path / "i-1"
    (inst_dir / "work" / "deep").mkdir(parents=True)
    (inst_dir / "work" / "deep" / "f").write_text("x")
    directory.remove(inst_dir)
    directory.remove(inst_dir)
    assert not inst_dir.exists()
