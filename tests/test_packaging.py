"""The installed environment imports our ``proto``, not another distribution's package of that name.

(a2a-sdk, a test dependency, pulls google-api-core and proto-plus; proto-plus installs a top-level
``proto`` that would shadow ours for every console script. The Makefile removes it.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_console_scripts_import_our_proto(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import proto; print(proto.__file__)"],
        cwd=tmp_path,  # not the checkout: what an installed console script sees
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(result.stdout.strip()).parent == ROOT / "proto", result.stdout
