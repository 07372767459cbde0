"""What a VM boots (hostd.providers.libvirt.bootimage), in memory and on real files: the two
pinned forms parsed, digests checked, the built guest image found by its manifest. Each refused
form through a real provision: tests/hostd/providers/libvirt/test_provider.py."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from agentic_sandbox.hostd.errors import RpcError
from agentic_sandbox.hostd.providers.libvirt import bootimage
from agentic_sandbox.hostd.providers.libvirt.bootimage import BootImage
from agentic_sandbox.proto import ErrorCode
from tests.libvirt_service import fake_guest_image

A = "a" * 64
B = "b" * 64


def pinned(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return f"{path}@sha256:{hashlib.sha256(data).hexdigest()}"


def test_a_disk_is_a_pinned_absolute_path_normalised() -> None:
    image, pins = bootimage.parse(f"qcow2:///var/lib//images/../images/disk.qcow2@sha256:{A}")
    assert image.disk == "/var/lib/images/disk.qcow2" and image.kernel is None and image.cmdline is None
    assert pins == [("/var/lib/images/disk.qcow2", A)]


def test_a_direct_boot_pins_kernel_and_initrd_and_gets_the_default_cmdline() -> None:
    ref = f"direct:///boot/vmlinuz@sha256:{A},/boot/initrd@sha256:{B}"
    image, pins = bootimage.parse(ref)
    assert image == BootImage(
        image_ref=ref, kernel="/boot/vmlinuz", initrd="/boot/initrd", cmdline=bootimage.DEFAULT_CMDLINE
    )
    assert pins == [("/boot/vmlinuz", A), ("/boot/initrd", B)]


@pytest.mark.parametrize(
    "ref",
    [
        f"qcow2:///d@sha256:{A.upper()}",  # hex digests are lower case, as sha256sum prints them
        f"qcow2:///d@sha256:{A[:63]}",
        f"qcow2:///d@sha256:{A},/e@sha256:{B}",
        f"qcow2:///d@sha256:{A} ",
        f"qcow2:///a b@sha256:{A}",
        f"direct:///k@sha256:{A},/i@sha256:{B},/x@sha256:{B}",
        f"direct:///k@sha256:{A},i@sha256:{B}",
        f"QCOW2:///d@sha256:{A}",
    ],
)
def test_what_is_not_exactly_a_pinned_form_is_refused(ref: str) -> None:
    with pytest.raises(RpcError) as refused:
        bootimage.parse(ref)
    assert refused.value.code is ErrorCode.REQUEST_INVALID and refused.value.details == {"image_ref": ref}


async def test_resolve_checks_every_pinned_file(tmp_path: Path) -> None:
    kernel = pinned(tmp_path / "k", b"kernel")
    initrd = pinned(tmp_path / "i", b"initrd")
    image = await bootimage.resolve(f"direct://{kernel},{initrd}", tmp_path / "unused")
    assert (image.kernel, image.initrd) == (str(tmp_path / "k"), str(tmp_path / "i"))
    (tmp_path / "i").write_bytes(b"swapped")
    with pytest.raises(
        RpcError, match=re.escape(f"{tmp_path / 'i'} has sha256:{hashlib.sha256(b'swapped').hexdigest()}")
    ):
        await bootimage.resolve(f"direct://{kernel},{initrd}", tmp_path / "unused")


def test_a_file_is_digested_whole_in_chunks(tmp_path: Path) -> None:
    data = bytes(range(256)) * 9000  # more than one 1 MiB read
    (tmp_path / "f").write_bytes(data)
    assert bootimage.sha256_file(str(tmp_path / "f")) == hashlib.sha256(data).hexdigest()


async def test_no_ref_is_the_built_guest_image_recorded_in_the_direct_form(tmp_path: Path) -> None:
    image_dir = fake_guest_image(tmp_path / "image")
    image = await bootimage.resolve(None, image_dir)
    assert (image.kernel, image.initrd, image.cmdline) == (
        str(image_dir / "vmlinuz"),
        str(image_dir / "initrd.img"),
        "console=ttyS0",
    )
    again, _ = bootimage.parse(image.image_ref)  # the recorded ref boots the same files
    assert (again.kernel, again.initrd) == (image.kernel, image.initrd)
    manifest = json.loads((image_dir / "manifest.json").read_text())
    del manifest["cmdline"]
    (image_dir / "manifest.json").write_text(json.dumps(manifest))
    assert (await bootimage.resolve(None, image_dir)).cmdline == bootimage.DEFAULT_CMDLINE


@pytest.mark.parametrize("manifest", [None, "{not json", "[]", '{"kernel": "vmlinuz"}'])
async def test_no_built_guest_image_is_provider_unavailable(tmp_path: Path, manifest: str | None) -> None:
    if manifest is not None:
        (tmp_path / "manifest.json").write_text(manifest)
    with pytest.raises(RpcError, match=re.escape("build-guest-image.py --out")) as missing:
        await bootimage.resolve(None, tmp_path)
    assert missing.value.code is ErrorCode.PROVIDER_UNAVAILABLE and missing.value.details == {
        "image_dir": str(tmp_path)
    }


async def test_a_built_image_whose_files_changed_is_refused(tmp_path: Path) -> None:
    image_dir = fake_guest_image(tmp_path / "image")
    (image_dir / "vmlinuz").write_bytes(b"another kernel")
    with pytest.raises(RpcError, match="vmlinuz has sha256:") as refused:
        await bootimage.resolve(None, image_dir)
    assert refused.value.code is ErrorCode.REQUEST_INVALID
