"""The process guard, proven in fresh interpreters (audit hooks cannot be removed from this one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.hostd_process import ROOT

ATTEMPTS = r"""
import json, os, pty, subprocess, sys
{install}
attempts = {{
    "subprocess.run": lambda: subprocess.run(["/bin/true"]),
    "os.popen": lambda: os.popen("true").close(),
    "os.fork": os.fork,
    "os.system": lambda: os.system("true"),
    "os.posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], dict(os.environ)),
    "os.posix_spawnp": lambda: os.posix_spawnp("true", ["true"], dict(os.environ)),
    "os.execv": lambda: os.execv("/bin/true", ["true"]),
    "os.spawnv": lambda: os.spawnv(os.P_WAIT, "/bin/true", ["true"]),
    "pty.fork": pty.fork,
    "pty.spawn": lambda: pty.spawn(["/bin/true"]),
}}
report = {{}}
for name, attempt in attempts.items():
    try:
        pid = attempt()
    except RuntimeError as exc:
        report[name] = "refused: " + str(exc)
        continue
    if name == "pty.fork":
        pid, fd = pid
        if pid:
            os.close(fd)
    if name in ("os.fork", "pty.fork", "os.posix_spawn", "os.posix_spawnp"):
        if pid == 0:  # this is a child that was actually forked (no guard): leave at once
            os._exit(0)
        os.waitpid(pid, 0)
    report[name] = "allowed"
print(json.dumps(report))
"""


def _run(script: str) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_process_creation_is_refused() -> None:
    report = _run(
        ATTEMPTS.format(
            install="from agentic_sandbox.controller.guard import install_process_guard\ninstall_process_guard()"
        )
    )
    assert report, "no attempt ran"
    for name, outcome in report.items():
        assert outcome.startswith("refused: the controller never starts processes"), (name, outcome)


def test_without_the_guard_the_same_script_runs_processes() -> None:
    # The control case: the attempts are real (except exec, which would replace the interpreter).
    script = ATTEMPTS.format(install="").replace('"os.execv": lambda: os.execv("/bin/true", ["true"]),', "")
    script = script.replace('"pty.spawn": lambda: pty.spawn(["/bin/true"]),', "")
    report = _run(script)
    assert report and all(outcome == "allowed" for outcome in report.values()), report


def test_main_installs_the_guard_before_building_the_app(tmp_path: Path) -> None:
    # Production mode without any admin token: configuration loads, the guard goes in, then
    # create_app refuses (exit 2). After main() returns the interpreter must refuse processes.
    script = f"""
import json, os, subprocess
os.environ.clear()
os.environ["AIWG_STATE_DIR"] = {str(tmp_path)!r}
from agentic_sandbox.controller.main import main
code = main([])
try:
    subprocess.run(["/bin/true"])
    outcome = "allowed"
except RuntimeError as exc:
    outcome = "refused"
print(json.dumps({{"code": code, "outcome": outcome}}))
"""
    assert _run(script) == {"code": 2, "outcome": "refused"}
