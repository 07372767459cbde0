#!/usr/bin/env python3
"""Build the local ``busybox`` container image from ``busybox-static`` (nothing can be pulled here).

The image is a rootfs of ``/bin/busybox`` with a symlink per applet (so ``sh``, ``ls``, ``sleep``
exist) and the usual top-level directories, ``podman import``-ed as ``localhost/busybox:latest``
into the storage hostd's podman service uses: the same ``AIWG_PODMAN_ROOT``,
``AIWG_PODMAN_RUNROOT`` and ``AIWG_PODMAN_STORAGE_DRIVER`` settings (unset: podman's defaults).
Nothing is done when the image is already there. ``make run`` calls it before hostd starts; the
tests build their shared image with it; so does the container benchmark.

Usage: ``python scripts/busybox_image.py [--force]`` (exit 0 and the image id on stdout).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
IMAGE = "localhost/busybox:latest"
TIMEOUT_S = 120


def podman_argv(env: Mapping[str, str]) -> list[str]:
    """podman with the storage and runtime flags hostd's own service gets from ``env``."""
    podman = shutil.which("podman")
    if podman is None:
        raise SystemExit("busybox_image: podman is not installed")
    argv = [podman, "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
    for flag, name in (
        ("--root", "AIWG_PODMAN_ROOT"),
        ("--runroot", "AIWG_PODMAN_RUNROOT"),
        ("--storage-driver", "AIWG_PODMAN_STORAGE_DRIVER"),
    ):
        if env.get(name):
            argv += [flag, env[name]]
    return argv


def rootfs_tar(path: Path) -> None:
    """/bin/busybox, a symlink per applet, and the directories programs expect."""
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    with tarfile.open(path, "w") as tar:
        for name in ("bin", "tmp", "root", "proc", "sys", "dev", "etc", "run"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        tar.add(BUSYBOX, arcname="bin/busybox")
        for applet in applets:
            if applet != "busybox":
                info = tarfile.TarInfo(f"bin/{applet}")
                info.type, info.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(info)


def import_image(
    env: Mapping[str, str],
    image: str,
    build: Callable[[Path], None],
    *,
    force: bool = False,
    changes: Sequence[str] = (),
    who: str = "busybox_image",
) -> str:
    """Import the rootfs tarball ``build`` writes as ``image`` unless it exists (or ``force``), into
    the storage ``env`` names; return its id. Exits with a message naming ``who`` on failure."""
    argv = podman_argv(env)
    for name in ("AIWG_PODMAN_ROOT", "AIWG_PODMAN_RUNROOT"):
        if env.get(name):
            os.makedirs(env[name], mode=0o700, exist_ok=True)
    if force or subprocess.run([*argv, "image", "exists", image], capture_output=True, timeout=TIMEOUT_S).returncode:
        with tempfile.TemporaryDirectory(prefix="aiwg-image-") as tmp:
            tarball = Path(tmp) / "rootfs.tar"
            build(tarball)
            change_args = [arg for change in changes for arg in ("--change", change)]
            imported = subprocess.run(
                [*argv, "import", *change_args, str(tarball), image], capture_output=True, timeout=TIMEOUT_S
            )
            if imported.returncode != 0:
                raise SystemExit(f"{who}: podman import failed: {imported.stderr.decode(errors='replace')}")
    inspected = subprocess.run(
        [*argv, "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    if inspected.returncode != 0:
        raise SystemExit(f"{who}: {image} is not there after the import: {inspected.stderr}")
    return inspected.stdout.strip()


def ensure(env: Mapping[str, str], *, image: str = IMAGE, force: bool = False) -> str:
    """Import ``image`` unless it exists (or ``force``); return its id."""
    if not BUSYBOX.exists():
        raise SystemExit("busybox_image: busybox-static is not installed (/bin/busybox)")
    return import_image(env, image, rootfs_tar, force=force)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--force", action="store_true", help="import again even if the image exists")
    parser.add_argument("--image", default=IMAGE, help=f"image reference (default {IMAGE})")
    args = parser.parse_args(argv)
    print(ensure(os.environ, image=args.image, force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
