"""The save image restamp (``hostd.providers.libvirt.saveimage``) on images laid out as libvirt's QEMU driver
writes them: the header, the domain XML and cookie in a padded data area, then QEMU's stream.

Whether libvirt then restores the restamped image as a new domain is tested with real QEMU in
``tests/hostd/test_vmguest.py`` (the fork); here, what the rewrite does and what it refuses."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from agentic_sandbox.hostd.providers.libvirt import domain, saveimage

STREAM = b"QEVM\x00\x00\x00\x03" + bytes(range(256)) * 64
COOKIE = b"<cookie>\n  <cpu mode='custom'/>\n</cookie>\n"
DOMAIN = """<domain type='qemu'>
  <name>aiwg-ns-source</name>
  <uuid>930e5522-b576-4716-a817-107ad17e3595</uuid>
  <metadata>
    <aiwg:instance xmlns:aiwg="https://agentic-sandbox.dev/hostd/vm/1" id="source" namespace="ns"/>
  </metadata>
  <memory unit='KiB'>131072</memory>
  <devices>
    <serial type='pty'><target port='0'/></serial>
  </devices>
</domain>
"""
NEW_UUID = "0d6f1c3e-52a4-4f10-9a59-6a8d2d7e0c11"


def image(path: Path, xml: str, *, pad: int = 4096, magic: bytes = saveimage.MAGIC, version: int = 2) -> Path:
    """A save image as libvirt writes it (cookieOffset = the XML's length with its NUL)."""
    data = xml.encode() + b"\0" + COOKIE + b"\0"
    data_len = len(data) + pad
    header = struct.pack("=16s19I", magic, version, data_len, 1, 0, len(xml.encode()) + 1, *([0] * 14))
    path.write_bytes(header + data + bytes(pad) + STREAM)
    return path


def read(path: Path) -> tuple[str, bytes, bytes, int]:
    raw = path.read_bytes()
    fields = struct.unpack("=16s19I", raw[:92])
    data_len, cookie_offset = fields[2], fields[5]
    data = raw[92 : 92 + data_len]
    xml = data[:cookie_offset].split(b"\0")[0].decode()
    cookie = data[cookie_offset:].split(b"\0")[0]
    return xml, cookie, raw[92 + data_len :], data_len


def test_restamp_gives_a_new_name_uuid_and_mark_and_keeps_the_rest(tmp_path: Path) -> None:
    path = image(tmp_path / "mem", DOMAIN)
    before = path.stat().st_size
    saveimage.restamp(path, name="aiwg-ns-fork", uuid=NEW_UUID, instance_id="fork", namespace="ns")
    xml, cookie, stream, data_len = read(path)
    assert "<name>aiwg-ns-fork</name>" in xml and f"<uuid>{NEW_UUID}</uuid>" in xml
    assert "aiwg-ns-source" not in xml and "930e5522" not in xml
    mark = xml[xml.index("<aiwg:instance") : xml.index("/>", xml.index("<aiwg:instance")) + 2]
    assert domain.parse_mark(mark) == domain.DomainMark("fork", "ns")
    assert "<memory unit='KiB'>131072</memory>" in xml  # libvirt's own text is left as it was
    assert cookie == COOKIE and stream == STREAM  # the migration stream is untouched
    assert path.stat().st_size == before and data_len == len(DOMAIN.encode()) + len(COOKIE) + 2 + 4096


def test_a_domain_without_a_mark_gets_one(tmp_path: Path) -> None:
    bare = DOMAIN.replace(DOMAIN[DOMAIN.index("  <metadata>") : DOMAIN.index("  <memory")], "")
    path = image(tmp_path / "mem", bare)
    saveimage.restamp(path, name="n", uuid=NEW_UUID, instance_id="i<&>", namespace="ns")
    xml = read(path)[0]
    assert 'id="i&lt;&amp;&gt;"' in xml and "<metadata><aiwg:instance" in xml


@pytest.mark.parametrize(
    ("xml", "kwargs", "why"),
    [
        (DOMAIN.replace("<devices>", "<devices><interface type='network'/>"), {}, "network interface"),
        (DOMAIN.replace("<devices>", "<devices><disk type='file'/>"), {}, "has a disk"),
        (DOMAIN, {"magic": b"LibvirtQemudPart"}, "not a complete"),
        (DOMAIN, {"version": 3}, "not a complete"),
        (DOMAIN, {"pad": 0}, "does not fit"),
    ],
)
def test_what_cannot_be_restamped_is_refused_and_left_alone(
    tmp_path: Path, xml: str, kwargs: dict[str, object], why: str
) -> None:
    path = image(tmp_path / "mem", xml, **kwargs)  # type: ignore[arg-type]
    before = path.read_bytes()
    name = "a-much-longer-name-than-before-" * 3 if kwargs.get("pad") == 0 else "n"
    with pytest.raises(saveimage.SaveImageError, match=why):
        saveimage.restamp(path, name=name, uuid=NEW_UUID, instance_id="i", namespace="ns")
    assert path.read_bytes() == before
