"""libvirt's QEMU driver and the tiny guest image, for the tests that boot real VMs.

systemd is not PID 1 here, so nothing starts libvirt for us: when nothing answers on
``qemu:///system`` the fixture starts ``virtlogd`` and ``libvirtd`` as daemons (``libvirtd``
alone cannot create domains without ``virtlogd``), as ``scripts/devrun.py`` does. They are left
running, like the system services they stand in for. Needs root; skips with the reason otherwise.

The guest image is built by ``scripts/build-guest-image.py`` into :data:`GUEST_IMAGE_CACHE`, which
keeps it between runs (the script rebuilds it when an input changed). Not in the run's temp root:
QEMU runs as libvirt's own user, which must be able to reach the kernel and initramfs, and pytest's
temp dirs are 0700.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_URI = "qemu:///system"
START_WAIT_S = 20.0
GUEST_IMAGE_CACHE = Path("/var/tmp/aiwg-test-guest-image")


def _answers(uri: str) -> bool:
    import libvirt

    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    try:
        libvirt.open(uri).close()
    except libvirt.libvirtError:
        return False
    return True


def ensure_libvirtd() -> str | None:
    """Make ``qemu:///system`` answer; None if it does, else why it cannot here."""
    try:
        import libvirt  # noqa: F401
    except ImportError:
        return "libvirt-python is not installed"
    if _answers(SYSTEM_URI):
        return None
    if os.geteuid() != 0:
        return "libvirtd is not running and starting it needs root"
    for daemon in ("virtlogd", "libvirtd"):
        if shutil.which(daemon) is None:
            return f"{daemon} is not installed (scripts/install-system-deps.sh installs it)"
    for daemon in ("virtlogd", "libvirtd"):
        subprocess.run([daemon, "-d"], check=False, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if _answers(SYSTEM_URI):
            return None
        time.sleep(0.1)
    return f"libvirtd did not answer on {SYSTEM_URI} within {START_WAIT_S:g} s"


def fake_guest_image(image_dir: Path) -> Path:
    """A guest image manifest as scripts/build-guest-image.py writes it, over files that boot
    nothing: for ``test:///default``, which boots nothing either."""
    image_dir.mkdir(parents=True, exist_ok=True)
    kernel, initrd = b"not a kernel", b"not an initrd"
    (image_dir / "vmlinuz").write_bytes(kernel)
    (image_dir / "initrd.img").write_bytes(initrd)
    manifest = {
        "kernel": "vmlinuz",
        "kernel_sha256": hashlib.sha256(kernel).hexdigest(),
        "initrd": "initrd.img",
        "initrd_sha256": hashlib.sha256(initrd).hexdigest(),
        "cmdline": "console=ttyS0",
    }
    (image_dir / "manifest.json").write_text(json.dumps(manifest))
    return image_dir


def build_guest_image(out: Path) -> Path:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build-guest-image.py"), "--out", str(out)], check=True)
    return out


@pytest.fixture(scope="session")
def libvirt_system() -> str:
    """``qemu:///system``, answering (skips the test when it cannot be made to)."""
    reason = ensure_libvirtd()
    if reason is not None:
        pytest.skip(reason)
    return SYSTEM_URI


@pytest.fixture(scope="session")
def guest_image() -> Iterator[Path]:
    """The tiny guest image (kernel, initramfs, manifest.json), built when missing or outdated."""
    if not list(Path("/boot").glob("vmlinuz-*-cloud-amd64")):
        pytest.skip("linux-image-cloud-amd64 is not installed (scripts/install-system-deps.sh installs it)")
    GUEST_IMAGE_CACHE.mkdir(mode=0o755, exist_ok=True)
    yield build_guest_image(GUEST_IMAGE_CACHE)
