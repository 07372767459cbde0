#!/usr/bin/env python3
"""Build a local container image in which Python agents run: busybox, this machine's Python, the
agent helper (``agentic_sandbox_agent``) and a2a-sdk (nothing can be pulled here).

The image is the busybox rootfs of ``scripts/busybox_image.py`` plus:

* the running interpreter (``sys.executable``, resolved) at its own path, linked as
  ``/usr/bin/python3``, its standard library (less ``test``, ``idlelib``, ``tkinter``,
  ``ensurepip``, ``lib2to3``), and every shared library ``ldd`` lists for it and its extension
  modules: the same paths as here, so the interpreter finds its prefix as it does here;
* the packages ``--module`` names import, with everything they import in turn (found by importing
  them here and keeping each loaded module's top-level package from outside the standard library),
  in the interpreter's own ``site-packages``.

It is ``podman import``-ed as ``--image`` (default ``localhost/aiwg-python-agent:latest``) into the
storage hostd's podman service uses (the same ``AIWG_PODMAN_*`` settings as ``busybox_image.py``);
nothing is done when it exists already (``--force`` builds it again). The container tests build
theirs with it; try an a2a-sdk agent in a container with ``make run`` after building it.

Usage: ``python scripts/python_image.py [--image REF] [--module NAME]... [--file SOURCE:PATH]...
[--force]`` (prints the image id; ``--file`` adds an agent's own files).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from busybox_image import import_image, rootfs_tar

IMAGE = "localhost/aiwg-python-agent:latest"
MODULES = ("agentic_sandbox_agent", "agentic_sandbox_agent.a2a")
SKIPPED_STDLIB = {"test", "idlelib", "tkinter", "ensurepip", "lib2to3", "turtledemo", "__pycache__", "site-packages"}
_LDD_LINE = re.compile(r"(/\S+) \(0x")


def imported_packages(modules: Iterable[str]) -> list[Path]:
    """The top-level packages (dirs or files) outside the standard library that importing
    ``modules`` loads, in a fresh interpreter."""
    probe = (
        "import importlib, sys, sysconfig\n"
        f"for name in {list(modules)!r}: importlib.import_module(name)\n"
        "base = {'base': sys.base_prefix, 'platbase': sys.base_exec_prefix}\n"
        "std = sysconfig.get_paths(vars=base)['stdlib'] + '/'\n"
        "for m in list(sys.modules.values()):\n"
        "    f = getattr(m, '__file__', None)\n"
        "    if f and (not f.startswith(std) or 'site-packages' in f): print(m.__name__.split('.')[0], f)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    found: set[Path] = set()
    for line in out.splitlines():
        top, file = line.split(" ", 1)
        path = Path(file)
        # The package directory holding the top-level name (namespace packages: their dir).
        while path.parent.name and path.name != top and path.stem != top.split(".")[0]:
            path = path.parent
        if path.name == top or path.stem == top:
            found.add(path)
    return sorted(found)


def shared_libraries(binaries: Iterable[Path]) -> set[Path]:
    libs: set[Path] = set()
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        for match in _LDD_LINE.finditer(out):
            libs.add(Path(match.group(1)))
        loader = re.search(r"^\s*(/\S*ld-linux\S*)", out, re.MULTILINE)
        if loader:
            libs.add(Path(loader.group(1)))
    return libs


def add_tree(tar: tarfile.TarFile, source: Path, arcname: str) -> None:
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if "__pycache__" in info.name.split("/") else info

    tar.add(source, arcname=arcname, filter=keep)


def build_tar(path: Path, modules: Iterable[str], files: Mapping[str, Path] | None = None) -> None:
    rootfs_tar(path)
    python = Path(os.path.realpath(sys.executable))
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    stdlib = Path(sysconfig.get_paths(vars=base)["stdlib"])
    packages = imported_packages(modules)
    extensions = [*(stdlib / "lib-dynload").glob("*.so")]
    for package in packages:
        extensions += package.rglob("*.so") if package.is_dir() else [package] if package.suffix == ".so" else []
    site = Path(sysconfig.get_paths(vars=base)["purelib"]).relative_to("/")
    with tarfile.open(path, "a") as tar:
        tar.add(python, arcname=str(python).lstrip("/"))
        link = tarfile.TarInfo("usr/bin/python3")
        link.type, link.linkname = tarfile.SYMTYPE, str(python)
        tar.addfile(link)
        for name in os.listdir(stdlib):
            if name not in SKIPPED_STDLIB and not name.startswith("config-"):
                add_tree(tar, stdlib / name, f"{stdlib.relative_to('/')}/{name}")
        for lib in sorted(shared_libraries([python, *extensions])):
            tar.add(os.path.realpath(lib), arcname=str(lib).lstrip("/"))
        for package in packages:
            add_tree(tar, package, f"{site}/{package.name}")
        for inside, source in (files or {}).items():
            tar.add(source, arcname=inside.lstrip("/"))


def ensure(
    env: Mapping[str, str],
    *,
    image: str = IMAGE,
    modules: Iterable[str] = MODULES,
    files: Mapping[str, Path] | None = None,
    force: bool = False,
) -> str:
    def build(tarball: Path) -> None:
        build_tar(tarball, modules, files)

    changes = ["ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8"]
    return import_image(env, image, build, force=force, changes=changes, who="python_image")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--force", action="store_true", help="build and import again even if the image exists")
    parser.add_argument("--image", default=IMAGE, help=f"image reference (default {IMAGE})")
    parser.add_argument(
        "--module", action="append", dest="modules", help=f"a module the image imports (default: {', '.join(MODULES)})"
    )
    parser.add_argument(
        "--file", action="append", default=[], metavar="SOURCE:PATH", help="add a file at PATH in the image"
    )
    args = parser.parse_args(argv)
    files = {inside: Path(source) for source, inside in (spec.rsplit(":", 1) for spec in args.file)}
    print(ensure(os.environ, image=args.image, modules=args.modules or MODULES, files=files, force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
