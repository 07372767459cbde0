"""The installed environment imports our ``proto``, not another distribution's package of that name.

(a2a-sdk, a test dependency, pulls google-api-core and proto-plus; proto-plus installs a top-level
``proto`` that would shadow ours for every console script. The Makefile removes it.) And the wheel
carries the web console's built files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from controller.console.assets import ConsoleAssets

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


@pytest.mark.slow
def test_the_wheel_ships_the_built_web_console(tmp_path: Path) -> None:
    """The web console's build (ignored by git) is package data: a wheel built from the tree
    carries every file its manifest lists, where the installed controller looks for them."""
    build = ROOT / "controller" / "console" / "build"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build-console.py")], check=True, capture_output=True)
    # A copy of what the wheel is made of, so setuptools' build/ folder never lands in the checkout.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("proto", "hostd", "controller", "cli"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), "."],
        cwd=source,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path / "installed")
    manifest = json.loads((build / "manifest.json").read_text())
    shipped = tmp_path / "installed" / "controller" / "console" / "build"
    for name in [*manifest["files"], "manifest.json"]:
        assert (shipped / name).read_bytes() == (build / name).read_bytes(), name
    assert ConsoleAssets.load(shipped).missing is None
