"""The distribution installs one import name, ``agentic_sandbox``, and lives beside anything else.

Generic top-level names collide in real environments: a2a-sdk (a test dependency, and the gRPC
binding's) pulls google-api-core, whose proto-plus installs a top-level ``proto``. So the wheel holds
``agentic_sandbox`` only, installs into a fresh environment beside proto-plus and imports every module
there; the project's own environment passes ``pip check``; the wheel carries the web console's build.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentic_sandbox.controller.console.assets import ConsoleAssets

ROOT = Path(__file__).resolve().parent.parent
CONSOLE_BUILD = ROOT / "src" / "agentic_sandbox" / "controller" / "console" / "build"
#: What a fresh environment imports to prove it: every module of the distribution.
IMPORT_ALL = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys
    import agentic_sandbox, proto
    names = [m.name for m in pkgutil.walk_packages(agentic_sandbox.__path__, "agentic_sandbox.")]
    for name in names:
        importlib.import_module(name)
    print(json.dumps({"ours": agentic_sandbox.__file__, "proto": proto.__file__, "modules": names}))
    """
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A wheel built from a copy of the tree (so setuptools' build/ folder never lands in the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build-console.py")], check=True, capture_output=True)
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp), "."],
        cwd=source,
        check=True,
        capture_output=True,
    )
    (built,) = tmp.glob("*.whl")
    yield built


@pytest.mark.slow
def test_the_wheel_holds_one_import_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
        entry_points = archive.read(next(n for n in archive.namelist() if n.endswith("entry_points.txt"))).decode()
    assert tops == {"agentic_sandbox"}, tops
    for script in ("agentic-hostd", "agentic-hostctl", "agentic-controller", "agentic ="):
        assert script in entry_points, entry_points


@pytest.mark.slow
def test_the_wheel_imports_every_module_beside_proto_plus(wheel: Path, tmp_path: Path) -> None:
    """A fresh environment holding the wheel, its dependencies and proto-plus (taken from the
    project's environment through a path entry, so nothing is downloaded): every module imports,
    ``agentic_sandbox`` from the wheel, ``proto`` from proto-plus."""
    proto_plus = subprocess.run(
        [sys.executable, "-c", "import proto; print(proto.__file__)"], capture_output=True, text=True, cwd=tmp_path
    )
    assert proto_plus.returncode == 0 and "site-packages" in proto_plus.stdout, (
        "proto-plus (a2a-sdk's google-api-core needs it) should be installed beside us: " + proto_plus.stderr
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    # The dependencies: the project's environment as a plain path entry. Its own .pth files (the
    # editable install's finder among them) are not processed from there, so ours comes from the wheel.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    result = subprocess.run(
        [python, "-c", IMPORT_ALL], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert Path(found["ours"]).is_relative_to(site), found["ours"]
    assert Path(found["proto"]).parent.name == "proto" and not Path(found["proto"]).is_relative_to(site)
    assert {
        "agentic_sandbox.proto.client",
        "agentic_sandbox.hostd.main",
        "agentic_sandbox.controller.main",
        "agentic_sandbox.cli.agentic",
    } <= set(found["modules"])


@pytest.mark.slow
def test_the_wheel_ships_the_built_web_console(wheel: Path, tmp_path: Path) -> None:
    """The web console's build (ignored by git) is package data: the wheel carries every file its
    manifest lists, where the installed controller looks for them."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path / "installed")
    manifest = json.loads((CONSOLE_BUILD / "manifest.json").read_text())
    shipped = tmp_path / "installed" / "agentic_sandbox" / "controller" / "console" / "build"
    for name in [*manifest["files"], "manifest.json"]:
        assert (shipped / name).read_bytes() == (CONSOLE_BUILD / name).read_bytes(), name
    assert ConsoleAssets.load(shipped).missing is None


def test_the_environment_passes_pip_check() -> None:
    """Nothing is uninstalled behind pip's back: every installed distribution's requirements hold."""
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
