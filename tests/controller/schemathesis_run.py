"""One schemathesis run against a live controller, as both OpenAPI tests make it: our own document
(test_openapi) and upstream's with its listed differences (test_upstream_contract)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import trio

from tests.hostd_process import ROOT

from .conftest import ADMIN_TOKEN


def seed() -> int:
    """A random seed, printed so a failing run can be repeated (``AIWG_SCHEMATHESIS_SEED``)."""
    value = int(os.environ.get("AIWG_SCHEMATHESIS_SEED") or random.randrange(2**32))
    print(f"schemathesis seed: {value} (AIWG_SCHEMATHESIS_SEED={value} repeats this run)")
    return value


async def run(
    config: Path,
    schema: str,
    url: str,
    tmp_path: Path,
    *,
    seed: int,
    max_examples: int,
    timeout_s: float,
    extra: list[str],
) -> None:
    """schemathesis with the admin token; its output is printed and kept in ``tmp_path``, and a
    non-zero exit fails the test, naming the seed."""
    argv = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "run",
        schema,
        "--url",
        url,
        *extra,
        "--header",
        f"Authorization: Bearer {ADMIN_TOKEN}",
        "--max-examples",
        str(max_examples),
        "--phases",
        "examples,coverage,fuzzing",
        "--workers",
        "1",
        "--seed",
        str(seed),
        "--request-timeout",
        "10",
        "--generation-database",
        "none",
        "--no-color",
        "--output-truncate",
        "false",
    ]
    with trio.fail_after(timeout_s):
        result = await trio.run_process(
            argv,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_stdout=True,
            stderr=subprocess.STDOUT,
            check=False,
        )
    output = result.stdout.decode(errors="replace")
    (tmp_path / "schemathesis.log").write_text(output)
    print(output)
    assert result.returncode == 0, f"schemathesis failed (seed {seed}); output above"
