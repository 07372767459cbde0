"""What podman's records mean for hostd (hostd/providers/podman/labels.py), in memory: image references,
limits as podman-py options, and how a container's state folds into an instance's."""

from __future__ import annotations

import pytest

from agentic_sandbox.hostd.providers.podman.labels import (
    OCI_REFERENCE,
    has_own_command,
    image_ref,
    limit_options,
    settle,
)
from agentic_sandbox.proto import messages as m

DIGEST = "sha256:" + "ab" * 32


def instance(state: str) -> tuple[m.InstanceInfo, m.ContainerDetail]:
    detail = m.ContainerDetail(container_name="aiwg-x", image="busybox", status="running", pid=7)
    info = m.InstanceInfo(
        instance_id="x", name="x", state=state, instance_dir="/d", working_dir="/", created_at=1.0, container=detail
    )  # type: ignore[arg-type]
    return info, detail


@pytest.mark.parametrize(
    ("attrs", "requested", "expected"),
    [
        (
            {"Digest": DIGEST, "RepoTags": ["localhost/busybox:latest"]},
            "localhost/busybox",
            f"localhost/busybox@{DIGEST}",
        ),
        (
            {"Digest": DIGEST, "RepoTags": ["reg:5000/team/tool:2"]},
            "reg:5000/team/tool:2",
            f"reg:5000/team/tool@{DIGEST}",
        ),
        ({"Id": "cd" * 32, "RepoTags": None}, "abc", f"abc@sha256:{'cd' * 32}"),
        ({"Digest": DIGEST}, f"busybox@{DIGEST}", f"busybox@{DIGEST}"),
    ],
)
def test_image_ref_is_the_repository_at_its_digest(attrs: dict, requested: str, expected: str) -> None:
    assert image_ref(attrs, requested) == expected


def test_oci_references() -> None:
    for good in ("busybox", "localhost/busybox:latest", "reg:5000/a/b:1.0", f"a/b@{DIGEST}", f"a:1@{DIGEST}"):
        assert OCI_REFERENCE.match(good), good
    for bad in ("Busybox", "a b", "qcow2://disk@sha256:00", "a:", "/abs", "a@sha256:short"):
        assert not OCI_REFERENCE.match(bad), bad


def test_own_command_and_limit_options() -> None:
    assert has_own_command({"Config": {"Cmd": ["sh"]}}) and has_own_command({"Config": {"Entrypoint": ["x"]}})
    assert not has_own_command({"Config": {"Cmd": None}}) and not has_own_command({})
    assert limit_options(None, nofile=10, nproc=20) == {
        "ulimits": [{"Name": "nofile", "Soft": 10, "Hard": 10}, {"Name": "nproc", "Soft": 20, "Hard": 20}]
    }
    options = limit_options(m.ResourceLimits(cpus=1.5, memory_bytes=1 << 26, pids=64), nofile=1, nproc=1)
    assert (options["cpu_period"], options["cpu_quota"], options["mem_limit"], options["pids_limit"]) == (
        100_000,
        150_000,
        1 << 26,
        64,
    )


def test_settle_running_container_is_adopted() -> None:
    info, detail = instance("failed")
    assert settle(info, detail, {"Id": "c1", "State": {"Status": "running", "Pid": 42}}, adopting=True)
    assert (info.state, info.adopted, info.note, detail.pid, detail.container_id) == ("running", True, None, 42, "c1")
    # Nothing new: nothing changed.
    assert not settle(info, detail, {"Id": "c1", "State": {"Status": "running", "Pid": 42}}, adopting=False)


@pytest.mark.parametrize(("code", "state"), [(0, "stopped"), (3, "failed")])
def test_settle_a_container_that_ended_by_itself(code: int, state: str) -> None:
    info, detail = instance("running")
    assert settle(info, detail, {"State": {"Status": "exited", "ExitCode": code}}, adopting=False)
    assert (info.state, info.exit_code, detail.pid) == (state, code, None)
    assert info.note == f"container aiwg-x exited with code {code}"
    info, detail = instance("running")
    settle(info, detail, {"State": {"Status": "exited", "ExitCode": code}}, adopting=True)
    assert info.adopted is False and info.note is not None and info.note.endswith("while hostd was down")


def test_settle_leaves_what_a_stop_is_doing_and_reports_a_removed_container() -> None:
    info, detail = instance("stopping")
    settle(info, detail, {"State": {"Status": "exited", "ExitCode": 137}}, adopting=False)
    assert info.state == "stopping"  # the stop records its own outcome
    info, detail = instance("running")
    assert settle(info, detail, None, adopting=False)
    assert (info.state, detail.status, info.note) == ("failed", "removed", "container aiwg-x no longer exists")
