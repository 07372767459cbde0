"""What a VM boots: ``image_ref`` parsed, its files found and their digests checked.

Two forms, both pinned by sha256 so a VM never boots a file other than the one asked for:

* ``qcow2://<absolute path>@sha256:<hex>``: a disk image, opened read-only with a throw-away
  overlay (``<transient/>``), so instances sharing it never write to it.
* ``direct://<kernel>@sha256:<hex>,<initrd>@sha256:<hex>``: a direct kernel boot (the tiny guest
  of ``scripts/build-guest-image.py``), booted with :data:`DEFAULT_CMDLINE`.

No ``image_ref``: the guest image built by ``scripts/build-guest-image.py`` in the configured
directory, read from its ``manifest.json`` (which names both files, their digests and the command
line); the instance records it in the ``direct://`` form.

Errors are ``RpcError(REQUEST_INVALID)`` naming what is wrong (a form not understood, a file that
is missing, a digest that does not match), or ``PROVIDER_UNAVAILABLE`` when the default image has
not been built. Digests are computed in a worker thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import msgspec
import trio

from agentic_sandbox.proto import ErrorCode

from ...errors import RpcError
from . import domain

DEFAULT_CMDLINE = "console=ttyS0 quiet panic=-1"
_PINNED = re.compile(r"(/[^@,\s]+)@sha256:([0-9a-f]{64})")


class BootImage(msgspec.Struct, frozen=True, kw_only=True):
    image_ref: str
    kernel: str | None = None
    initrd: str | None = None
    cmdline: str | None = None
    disk: str | None = None
    #: The guest runs the agent channel's helper (the manifest of the built image says so).
    agent_channel: bool = False


def _invalid(image_ref: str, why: str) -> RpcError:
    return RpcError(ErrorCode.REQUEST_INVALID, f"image_ref {image_ref!r}: {why}", image_ref=image_ref)


def _pinned(image_ref: str, part: str) -> tuple[str, str]:
    match = _PINNED.fullmatch(part)
    if match is None:
        raise _invalid(image_ref, f"{part!r} is not <absolute path>@sha256:<64 hex digits>")
    return os.path.normpath(match.group(1)), match.group(2)


def parse(image_ref: str) -> tuple[BootImage, list[tuple[str, str]]]:
    """The boot image and the (path, digest) pairs to check; raises for a form not understood."""
    if image_ref.startswith("qcow2://"):
        disk = _pinned(image_ref, image_ref.removeprefix("qcow2://"))
        return BootImage(image_ref=image_ref, disk=disk[0]), [disk]
    if image_ref.startswith("direct://"):
        parts = image_ref.removeprefix("direct://").split(",")
        if len(parts) != 2:
            raise _invalid(image_ref, "direct:// takes <kernel>@sha256:<hex>,<initrd>@sha256:<hex>")
        kernel, initrd = (_pinned(image_ref, p) for p in parts)
        image = BootImage(image_ref=image_ref, kernel=kernel[0], initrd=initrd[0], cmdline=DEFAULT_CMDLINE)
        return image, [kernel, initrd]
    raise _invalid(image_ref, "only qcow2://PATH@sha256:HEX and direct://KERNEL@sha256:HEX,INITRD@sha256:HEX")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _check(image_ref: str, pins: list[tuple[str, str]]) -> None:
    for path, digest in pins:
        try:
            actual = sha256_file(path)
        except OSError as exc:
            raise _invalid(image_ref, f"{path}: {exc.strerror or exc}") from None
        if actual != digest:
            raise _invalid(image_ref, f"{path} has sha256:{actual}, not sha256:{digest}")


def _default(image_dir: Path) -> tuple[BootImage, list[tuple[str, str]]]:
    manifest = image_dir / "manifest.json"
    try:
        data = json.loads(manifest.read_text())
        kernel = str(image_dir / data["kernel"])
        initrd = str(image_dir / data["initrd"])
        pins = [(kernel, str(data["kernel_sha256"])), (initrd, str(data["initrd_sha256"]))]
        cmdline = str(data.get("cmdline") or DEFAULT_CMDLINE)
        agent_channel = data.get("agent_channel") == domain.AGENT_CHANNEL
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RpcError(
            ErrorCode.PROVIDER_UNAVAILABLE,
            f"no guest image in {image_dir} ({exc}); build it with scripts/build-guest-image.py --out {image_dir}",
            image_dir=str(image_dir),
        ) from None
    ref = f"direct://{pins[0][0]}@sha256:{pins[0][1]},{pins[1][0]}@sha256:{pins[1][1]}"
    image = BootImage(image_ref=ref, kernel=kernel, initrd=initrd, cmdline=cmdline, agent_channel=agent_channel)
    return image, pins


async def resolve(image_ref: str | None, default_dir: Path) -> BootImage:
    """The checked boot image of ``image_ref`` (None: the built guest image in ``default_dir``)."""
    image, pins = parse(image_ref) if image_ref is not None else _default(default_dir)
    await trio.to_thread.run_sync(_check, image.image_ref, pins)
    return image
