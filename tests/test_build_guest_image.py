"""``scripts/build-guest-image.py``: what the initramfs holds, and the cache that rebuilds only on change."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostd_process import ROOT

SCRIPT = ROOT / "scripts" / "build-guest-image.py"

pytestmark = pytest.mark.skipif(
    not list(Path("/boot").glob("vmlinuz-*-cloud-amd64")) or not Path("/usr/sbin/qemu-ga").exists(),
    reason="linux-image-cloud-amd64 and qemu-guest-agent are not installed (scripts/install-system-deps.sh)",
)


def build(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *extra], capture_output=True, text=True)


def cpio_names(data: bytes) -> dict[str, int]:
    """name -> mode of every entry of a newc archive."""
    names, pos = {}, 0
    while True:
        header = data[pos : pos + 110]
        assert header[:6] == b"070701"
        fields = [int(header[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        name = data[pos + 110 : pos + 110 + namesize - 1].decode()
        if name == "TRAILER!!!":
            return names
        names[name] = mode
        pos += 110 + namesize
        pos += -pos % 4
        pos += size + (-size % 4)


def test_image_holds_kernel_modules_busybox_and_the_agent(tmp_path: Path) -> None:
    result = build(tmp_path / "img")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "img")
    manifest = json.loads((tmp_path / "img" / "manifest.json").read_text())
    for key in ("kernel", "initrd"):
        data = (tmp_path / "img" / manifest[key]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == manifest[f"{key}_sha256"]
    assert manifest["cmdline"].startswith("console=ttyS0")
    names = cpio_names(gzip.decompress((tmp_path / "img" / "initrd.img").read_bytes()))
    for name in ("init", "bin/busybox", "usr/sbin/qemu-ga", "lib64/ld-linux-x86-64.so.2"):
        assert names[name] & 0o111, name  # executable (the loader too: exec of qemu-ga needs it)
    modules = [n.rsplit("/", 1)[1] for n in names if n.startswith("lib/modules/")]
    assert set(modules) >= {"virtio_ring.ko", "virtio.ko", "virtio_pci.ko", "virtio_console.ko"}
    init = gzip.decompress((tmp_path / "img" / "initrd.img").read_bytes())
    assert b"for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_console" in init


def test_rebuilt_only_when_an_input_changed(tmp_path: Path) -> None:
    out = tmp_path / "img"
    assert build(out).returncode == 0
    first = (out / "initrd.img").stat().st_mtime_ns
    assert build(out).returncode == 0
    assert (out / "initrd.img").stat().st_mtime_ns == first  # cached
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["inputs_sha256"] = "0" * 64  # as if an input (kernel, busybox, qemu-ga, this script) changed
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert build(out).returncode == 0
    assert (out / "initrd.img").stat().st_mtime_ns != first
    assert json.loads((out / "manifest.json").read_text())["inputs_sha256"] != "0" * 64
