"""What agentic-hostctl prints, in memory: JSON without wire-only keys, aligned tables, one line per
failure and its exit status. The commands themselves run as subprocesses in test_hostctl.py; the
one path that needs a real stdout (a closed pipe) runs as one here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_sandbox.cli.output import (
    UsageError,
    describe_error,
    exit_status,
    exit_text,
    leaf_error,
    opt,
    plain,
    print_instances,
    print_json,
    print_sessions,
    print_table,
)
from agentic_sandbox.proto import (
    HostdConnectionLost,
    HostdNotRunning,
    HostdProtocolError,
    HostdRemoteError,
    HostdStreamOverflow,
    HostdTimeout,
    HostdUnavailable,
    HostdVersionMismatch,
)
from agentic_sandbox.proto import messages as m


def _session(**kw: object) -> m.SessionInfo:
    fields: dict[str, object] = {
        "session_id": "s1", "instance_id": "i1", "argv": ["bash", "-l"], "cwd": "/", "pid": 42, "cols": 80,
        "rows": 24, "state": "running", "created_at": 1.0,
    }  # fmt: skip
    fields.update(kw)
    return m.SessionInfo(**fields)  # type: ignore[arg-type]


def _instance(**kw: object) -> m.InstanceInfo:
    return m.InstanceInfo(
        instance_id="i1", name="a", state="running", instance_dir="/d", working_dir="/w", created_at=1.0, **kw
    )  # type: ignore[arg-type]


def test_json_leaves_out_the_tag_and_the_request_id(capsys: pytest.CaptureFixture[str]) -> None:
    resp = m.InstanceGetResponse(id=7, instance=_instance())
    assert "t" not in plain(resp) and "id" not in plain(resp)
    print_json(resp)
    printed = json.loads(capsys.readouterr().out)
    assert printed["instance"]["instance_id"] == "i1" and "t" not in printed
    assert plain([1, 2]) == [1, 2]  # not a struct: as is


def test_tables_align_columns_and_strip_trailing_space(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(["A", "LONG HEADER"], [["wide cell", ""], ["x", "y"]])
    assert capsys.readouterr().out.splitlines() == ["A          LONG HEADER", "wide cell", "x          y"]
    print_table(["ONLY"], [])
    assert capsys.readouterr().out == "ONLY\n"


def test_session_rows_say_how_each_ended(capsys: pytest.CaptureFixture[str]) -> None:
    sessions = [
        _session(),
        _session(session_id="s2", state="exited", exit_code=3, pid=None, first_seq=1, next_seq=10),
        _session(session_id="s3", state="exited", signal=9),
        _session(session_id="s4", pending=True, pid=None),
    ]
    print_sessions(sessions, as_json=False)
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split() == ["SESSION", "INSTANCE", "STATE", "PID", "SEQ", "COMMAND"]
    assert rows[1].split() == ["s1", "i1", "running", "42", "-", "bash", "-l"]
    assert "exited with code 3" in rows[2] and "1-9" in rows[2] and " - " in rows[2]
    assert "killed by signal 9" in rows[3]
    assert rows[4].split()[2] == "pending"
    assert (exit_text(0, None), exit_text(None, 15), opt(None), opt(0)) == (
        "exited with code 0", "killed by signal 15", "-", "0",
    )  # fmt: skip


def test_instance_rows(capsys: pytest.CaptureFixture[str]) -> None:
    info = _instance(host=m.HostDetail(pid=7), sessions=2)
    print_instances([info], as_json=False)
    assert capsys.readouterr().out.splitlines()[1].split() == ["i1", "a", "host/hostd", "running", "7", "2", "0", "/w"]


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (HostdConnectionLost("eof"), "lost the connection to hostd at /s: eof"),
        (HostdUnavailable("refused"), "cannot reach hostd at /s: refused"),
        (HostdTimeout("5 s"), "hostd at /s did not answer in time: 5 s"),
        (HostdVersionMismatch("2 != 1"), "hostd at /s speaks another protocol version: 2 != 1"),
        (HostdProtocolError("junk"), "protocol error talking to hostd at /s: junk"),
        (HostdStreamOverflow("behind"), "output stream fell behind: behind"),
        (HostdRemoteError("instance.not_found", "no such instance"), "no such instance [instance.not_found]"),
        (HostdRemoteError("x.y", "no", {"a": 1, "b": "c"}), "no [x.y] (a=1, b=c)"),
    ],
)
def test_each_failure_is_one_line(exc: Exception, line: str) -> None:
    assert describe_error(exc, "/s") == line  # type: ignore[arg-type]


def test_not_running_says_whether_the_socket_exists(tmp_path: Path) -> None:
    missing = f"{tmp_path}/none.sock"
    assert describe_error(HostdNotRunning("x"), missing) == f"hostd is not running at {missing} (no such socket)"
    present = f"{tmp_path}"  # exists (a directory stands in for a socket nobody listens on)
    assert describe_error(HostdNotRunning("x"), present).endswith("(nothing listens on the socket)")


def test_the_error_to_report_is_found_inside_groups() -> None:
    inner = HostdTimeout("late")
    group = ExceptionGroup("outer", [ValueError("noise"), ExceptionGroup("inner", [inner])])
    assert leaf_error(group) is inner
    assert isinstance(leaf_error(ExceptionGroup("g", [ValueError("v")])), ValueError)  # none known: the first
    plain_exc = KeyError("k")
    assert leaf_error(plain_exc) is plain_exc


def test_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        exit_status(HostdRemoteError("a.b", "nope"), "/s")
    assert ended.value.code == 1 and capsys.readouterr().err == "agentic-hostctl: nope [a.b]\n"
    with pytest.raises(SystemExit) as ended:
        exit_status(ExceptionGroup("g", [UsageError("bad flag")]), "/s")
    assert ended.value.code == 2 and capsys.readouterr().err == "agentic-hostctl: bad flag\n"
    assert exit_status(KeyboardInterrupt(), "/s") == 130
    bug = RuntimeError("a bug keeps its traceback")
    with pytest.raises(RuntimeError, match="keeps its traceback"):
        try:
            raise bug
        except RuntimeError as exc:
            exit_status(exc, "/s")


def test_a_closed_stdout_ends_quietly() -> None:
    """``| head``: the reader went away; status 0, nothing on stderr (a real pipe, closed)."""
    code = (
        "import sys\n"
        "from agentic_sandbox.cli.output import exit_status\n"
        "try:\n"
        "    for i in range(100000): print('line', i)\n"
        "    sys.stdout.flush()\n"
        "except BaseException as exc:\n"
        "    sys.exit(exit_status(exc, '/s'))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=30) == 0 and err == b""
