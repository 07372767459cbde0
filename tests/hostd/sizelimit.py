"""Run a snippet in a fresh interpreter whose files may not grow past a size (``RLIMIT_FSIZE``).

The kernel then cuts a write short at the limit and fails the next one with ``EFBIG``: what a
full disk or a quota does, without filling one.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

#: The repository's root: the snippet imports ``agentic_sandbox`` and ``tests`` from it.
ROOT = Path(__file__).resolve().parents[2]

_PRELUDE = """
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
"""


def run_capped(code: str, limit: int) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with files capped at ``limit`` bytes; its output, checked to have exited 0."""
    script = _PRELUDE.format(limit=limit) + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60, cwd=ROOT
    )
