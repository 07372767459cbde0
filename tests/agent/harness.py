"""The controller's side of an agent's control channel, for the agent tests.

An agent runs as a real subprocess holding one end of a real ``socket.socketpair()`` (its fd number
in ``AIWG_CONTROL_FD``, passed with ``pass_fds``); the test holds the other end and plays the
controller. Every line either side writes is validated against docs/schemas/agent-protocol-v2.json.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

ROOT = Path(__file__).resolve().parents[2]
AGENT_SRC = ROOT / "agent" / "src"
AGENTS = Path(__file__).resolve().parent / "agents"
SCHEMA = json.loads((ROOT / "docs" / "schemas" / "agent-protocol-v2.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA)
#: What a test waits at most for one line or for the agent to exit.
TIMEOUT = 30.0


def check_stdlib_only(source_file: Path, module: str, *, helper_import: bool) -> None:
    """``source_file`` (module ``module`` of the helper distribution) is Python 3.9 syntax, imports
    only the standard library (``helper_import``: and the helper, as ``from . import ...``; else no
    relative import at all), and imported alone, without site-packages, loads nothing else."""
    source = source_file.read_text()
    tree = ast.parse(source, feature_version=(3, 9))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.level == 0 or not helper_import):
            assert node.level == 0, "no relative imports"
            imported.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 1 and node.module is None, "only the helper, from its own package"
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    assert "from __future__ import annotations" in source
    probe = (
        f"import sys; sys.path.insert(0, {str(AGENT_SRC)!r}); import {module}; "
        "print([m for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names"
        " and m.split('.')[0] not in ('agentic_sandbox_agent', '__main__')])"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def check_line(line: dict[str, Any]) -> None:
    """Valid against the protocol's schema, and every ``raw`` part real base64."""
    error = best_match(VALIDATOR.iter_errors(line))
    assert error is None, f"{error.message} at {list(error.absolute_path)} in {json.dumps(line)[:2000]}"
    for parts in _all_parts(line):
        for part in parts:
            if "raw" in part:
                base64.b64decode(part["raw"], validate=True)


def _all_parts(line: dict[str, Any]) -> list[list[dict[str, Any]]]:
    found = []
    if isinstance(line.get("parts"), list):
        found.append(line["parts"])
    if isinstance(line.get("message"), dict):
        found.append(line["message"].get("parts", []))
    return found


def user_message(*parts: dict[str, Any], text: str | None = None) -> dict[str, Any]:
    """A client's A2A Message, as the controller hands it over."""
    return {
        "messageId": str(uuid.uuid4()),
        "role": "ROLE_USER",
        "parts": list(parts) or [{"text": text or ""}],
    }


class Agent:
    """One agent process and the controller's end of its channel."""

    def __init__(
        self,
        argv: list[str],
        tmp_path: Path,
        *,
        channel: bool = True,
        protocol: str | None = "2",
        stdin: bytes = b"",
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.task_id = "task-" + uuid.uuid4().hex[:8]
        self.context_id = "ctx-" + uuid.uuid4().hex[:8]
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("AIWG_")}
        child_env["PYTHONPATH"] = os.pathsep.join([str(AGENT_SRC), str(AGENTS)])
        child_env["PYTHONUNBUFFERED"] = "1"
        child_env.update({"AIWG_TASK_ID": self.task_id, "AIWG_CONTEXT_ID": self.context_id})
        if protocol is not None:
            child_env["AIWG_AGENT_PROTOCOL"] = protocol
        child_env.update(env or {})
        self.stdout_path = tmp_path / f"stdout-{self.task_id}"
        self.stderr_path = tmp_path / f"stderr-{self.task_id}"
        stdin_path = tmp_path / f"stdin-{self.task_id}"
        stdin_path.write_bytes(stdin)
        self.sock: socket.socket | None = None
        pass_fds: tuple[int, ...] = ()
        child: socket.socket | None = None
        if channel:
            self.sock, child = socket.socketpair()
            self.sock.settimeout(TIMEOUT)
            child_env["AIWG_CONTROL_FD"] = str(child.fileno())
            pass_fds = (child.fileno(),)
        with (
            open(stdin_path, "rb") as stdin_file,
            open(self.stdout_path, "wb") as out,
            open(self.stderr_path, "wb") as err,
        ):
            self.proc = subprocess.Popen(
                [python, *argv],
                env=child_env,
                cwd=cwd or AGENTS,
                stdin=stdin_file,
                stdout=out,
                stderr=err,
                pass_fds=pass_fds,
            )
        if child is not None:
            child.close()
        self._reader = self.sock.makefile("rb") if self.sock is not None else None
        #: Every line the agent wrote, in order.
        self.lines: list[dict[str, Any]] = []

    # --- the channel

    def read(self) -> dict[str, Any]:
        """The agent's next line (validated); AssertionError at EOF."""
        line = self.read_or_eof()
        assert line is not None, f"the agent closed the channel; stderr:\n{self.stderr()}"
        return line

    def read_or_eof(self) -> dict[str, Any] | None:
        assert self._reader is not None
        raw = self._reader.readline(2 * 1024 * 1024)
        if not raw:
            return None
        assert raw.endswith(b"\n"), raw[:200]
        assert len(raw) <= 1024 * 1024, f"a line of {len(raw)} bytes"
        line = json.loads(raw)
        assert isinstance(line, dict)
        check_line(line)
        self.lines.append(line)
        return line

    def read_all(self) -> list[dict[str, Any]]:
        """The agent's lines up to EOF."""
        out = []
        while (line := self.read_or_eof()) is not None:
            out.append(line)
        return out

    def send(self, line: dict[str, Any]) -> None:
        """A controller line (validated too: the tests speak the protocol as the controller must)."""
        assert self.sock is not None
        check_line(line)
        self.sock.sendall(json.dumps(line).encode() + b"\n")

    def send_many(self, *lines: dict[str, Any]) -> None:
        """Several controller lines in one write (so none races the agent's exit)."""
        assert self.sock is not None
        for line in lines:
            check_line(line)
        self.sock.sendall(b"".join(json.dumps(line).encode() + b"\n" for line in lines))

    def send_raw(self, data: bytes) -> None:
        assert self.sock is not None
        self.sock.sendall(data)

    def send_task(
        self,
        message: dict[str, Any] | None = None,
        *,
        text: str = "",
        extensions: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        line: dict[str, Any] = {
            "type": "task",
            "version": 2,
            "taskId": self.task_id,
            "contextId": self.context_id,
            "message": message or user_message(text=text),
            "extensions": extensions or [],
        }
        if metadata is not None:
            line["metadata"] = metadata
        self.send(line)
        return line

    def hello_and_task(self, **task: Any) -> dict[str, Any]:
        """Read hello (which comes first, before the task is sent), then send the task."""
        hello = self.read()
        assert hello["type"] == "hello" and hello["version"] == 2, hello
        self.send_task(**task)
        return hello

    # --- the process

    def wait(self) -> int:
        try:
            return self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the agent did not exit; stderr:\n{self.stderr()}") from None

    def stdout(self) -> bytes:
        return self.stdout_path.read_bytes()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self._reader is not None:
            self._reader.close()
        if self.sock is not None:
            self.sock.close()
