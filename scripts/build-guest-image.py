#!/usr/bin/env python3
"""Build the tiny direct-boot guest image of the VM runtime from installed Debian packages.

Inputs (``scripts/install-system-deps.sh`` installs them): the Debian cloud kernel
(``linux-image-cloud-amd64``: ``/boot/vmlinuz-*-cloud-amd64`` and its virtio modules),
``busybox-static`` and ``qemu-guest-agent`` with the libraries ``ldd`` lists for it, and the agent
channel's helper ``scripts/guest/aiwg-guest.c``, compiled here statically with ``gcc``.

Output, in ``--out`` (default ``$AIWG_VM_IMAGE_DIR``, else ``/var/cache/agentic-sandbox/guest-image``,
hostd's default; outside hostd's 0700 state dir, since QEMU runs as libvirt's own user):
``vmlinuz``, ``initrd.img`` (a gzipped newc cpio written here, no cpio tool needed) and
``manifest.json`` naming both with their sha256 digests, the kernel command line and a digest of
every input. The image is rebuilt only when an input changed (or ``--force``); the manifest is
written last, so a build cut short is redone.

The guest's ``/init`` mounts /proc, /sys, /dev, loads the virtio modules in dependency order
(``virtio`` before ``virtio_ring`` fails on unknown symbols), starts ``qemu-ga`` on the virtio port
of the ``org.qemu.guest_agent.0`` channel, ``aiwg-guest daemon`` on the port of the
``org.aiwg.agent.0`` channel (each exec's control channel, see the C source), and runs a login-less
shell on the serial console (``setsid cttyhack sh``), respawned when it exits. The manifest says
``"agent_channel": "org.aiwg.agent.0"``: hostd offers ``exec.control`` on VMs booted from it.

Prints the output directory. Exit 1 with a message when an input is missing.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

#: Layout version of the output (the script's own text is an input too, see inputs_digest).
FORMAT = 2
MODULES = [
    "kernel/drivers/virtio/virtio_ring.ko",
    "kernel/drivers/virtio/virtio.ko",
    "kernel/drivers/virtio/virtio_pci_modern_dev.ko",
    "kernel/drivers/virtio/virtio_pci_legacy_dev.ko",
    "kernel/drivers/virtio/virtio_pci.ko",
    "kernel/drivers/char/virtio_console.ko",
]
BUSYBOX = Path("/bin/busybox")
QEMU_GA = Path("/usr/sbin/qemu-ga")
CMDLINE = "console=ttyS0 quiet panic=-1"
GUEST_HELPER = Path(__file__).resolve().parent / "guest" / "aiwg-guest.c"
AGENT_CHANNEL = "org.aiwg.agent.0"
PROMPT = "aiwg-vm# "

INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /tmp /run /var/run
mount -t devpts devpts /dev/pts
for m in {" ".join(Path(p).stem for p in MODULES)}; do insmod /lib/modules/$m.ko; done
hostname aiwg-vm
port_of() {{
  for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    for p in /sys/class/virtio-ports/*; do
      [ "$(cat $p/name 2>/dev/null)" = "$1" ] && echo /dev/$(basename $p) && return
    done
    sleep 0.1
  done
}}
port=$(port_of org.qemu.guest_agent.0)
[ -n "$port" ] && qemu-ga -m virtio-serial -p "$port" -d -t /run
agent_port=$(port_of {AGENT_CHANNEL})
[ -n "$agent_port" ] && setsid aiwg-guest daemon "$agent_port" </dev/null >/dev/null 2>&1 &
export PS1='{PROMPT}'
echo "aiwg guest ready"
while true; do setsid cttyhack sh; done
"""


class BuildError(Exception):
    pass


def kernel_release() -> str:
    found = sorted(Path("/boot").glob("vmlinuz-*-cloud-amd64"))
    if not found:
        raise BuildError("no /boot/vmlinuz-*-cloud-amd64: install linux-image-cloud-amd64")
    return found[-1].name.removeprefix("vmlinuz-")


def libraries(binary: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        match = re.search(r"(/\S+) \(0x", line)
        if match:
            found.append(Path(match.group(1)))
    return found


def inputs() -> dict[str, Path]:
    """Guest path -> host file, for everything the image holds besides /init."""
    release = kernel_release()
    files = {"vmlinuz": Path(f"/boot/vmlinuz-{release}")}
    for mod in MODULES:
        files[f"lib/modules/{Path(mod).name}"] = Path(f"/lib/modules/{release}/{mod}")
    for path in (BUSYBOX, QEMU_GA):
        if not path.exists():
            raise BuildError(f"{path} is missing: install busybox-static and qemu-guest-agent")
    files["bin/busybox"] = BUSYBOX
    files["usr/sbin/qemu-ga"] = QEMU_GA
    if shutil.which("gcc") is None:
        raise BuildError("gcc is missing (it compiles the guest's agent helper): install gcc")
    for lib in libraries(QEMU_GA):
        files[str(lib).lstrip("/")] = lib.resolve()
    for guest, host in files.items():
        if not host.exists():
            raise BuildError(f"{host} (for {guest}) is missing")
    return files


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def compile_helper() -> bytes:
    """``aiwg-guest``, static (the guest has no C library of its own)."""
    with tempfile.TemporaryDirectory(prefix="aiwg-guest-") as tmp:
        binary = Path(tmp) / "aiwg-guest"
        built = subprocess.run(
            ["gcc", "-static", "-Os", "-s", "-Wall", "-o", str(binary), str(GUEST_HELPER)],
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            raise BuildError(f"cannot compile {GUEST_HELPER}: {built.stderr.strip()}")
        return binary.read_bytes()


def inputs_digest(files: dict[str, Path]) -> str:
    # This script itself is an input: a change of /init or of the layout rebuilds the image; so
    # is the helper's source.
    h = hashlib.sha256(f"format {FORMAT}\n".encode() + Path(__file__).read_bytes() + GUEST_HELPER.read_bytes())
    for guest in sorted(files):
        h.update(f"{guest} {sha256_file(files[guest])}\n".encode())
    return h.hexdigest()


class Cpio:
    """A newc ("070701") archive, as the kernel's initramfs unpacker reads it."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.ino = 1
        self.dirs: set[str] = set()

    def _entry(self, name: str, mode: int, data: bytes = b"") -> None:
        fields = [self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
        self.ino += 1
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        self.buf.write(header + name.encode() + b"\0")
        self.buf.write(b"\0" * (-self.buf.tell() % 4))
        self.buf.write(data)
        self.buf.write(b"\0" * (-self.buf.tell() % 4))

    def directory(self, name: str) -> None:
        parts = name.split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if sub and sub not in self.dirs:
                self.dirs.add(sub)
                self._entry(sub, stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, mode: int = 0o755) -> None:
        self.directory(os.path.dirname(name))
        self._entry(name, stat.S_IFREG | mode, data)

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        return self.buf.getvalue()


def build(out: Path, *, force: bool = False) -> Path:
    files = inputs()
    digest = inputs_digest(files)
    manifest_path = out / "manifest.json"
    if not force and manifest_path.exists():
        try:
            if json.loads(manifest_path.read_text()).get("inputs_sha256") == digest:
                return out
        except (OSError, ValueError):
            pass
    out.mkdir(mode=0o755, parents=True, exist_ok=True)
    manifest_path.unlink(missing_ok=True)
    archive = Cpio()
    for d in ("proc", "sys", "dev", "tmp", "run", "sbin", "usr/bin"):
        archive.directory(d)
    archive.file("init", INIT.encode())
    archive.file("bin/aiwg-guest", compile_helper())
    for guest, host in sorted(files.items()):
        if guest != "vmlinuz":
            archive.file(guest, host.read_bytes(), 0o644 if guest.endswith(".ko") else 0o755)
    initrd = gzip.compress(archive.finish(), compresslevel=6)
    tmp_initrd, tmp_kernel = out / "initrd.img.tmp", out / "vmlinuz.tmp"
    tmp_initrd.write_bytes(initrd)
    shutil.copyfile(files["vmlinuz"], tmp_kernel)
    os.replace(tmp_initrd, out / "initrd.img")
    os.replace(tmp_kernel, out / "vmlinuz")
    manifest = {
        "format": FORMAT,
        "kernel": "vmlinuz",
        "kernel_sha256": sha256_file(out / "vmlinuz"),
        "initrd": "initrd.img",
        "initrd_sha256": hashlib.sha256(initrd).hexdigest(),
        "cmdline": CMDLINE,
        "prompt": PROMPT,
        "kernel_release": kernel_release(),
        "inputs_sha256": digest,
        "agent_channel": AGENT_CHANNEL,
    }
    tmp_manifest = out / "manifest.json.tmp"
    tmp_manifest.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp_manifest, manifest_path)
    return out


def default_out() -> Path:
    return Path(os.environ.get("AIWG_VM_IMAGE_DIR") or "/var/cache/agentic-sandbox/guest-image")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: $AIWG_VM_IMAGE_DIR or hostd's default)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if the inputs did not change")
    args = parser.parse_args()
    try:
        out = build((args.out or default_out()).resolve(), force=args.force)
    except (BuildError, subprocess.CalledProcessError, OSError) as exc:
        print(f"build-guest-image: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
