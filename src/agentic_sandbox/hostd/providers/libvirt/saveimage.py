"""A libvirt QEMU save image given another domain identity: what makes a VM fork possible.

libvirt restores a save image (``virDomainSave``, or the memory file of an external snapshot) only
as the domain the image names: the API refuses any other UUID or name ("Target domain uuid ...
does not match source"), because its ABI check compares the two definitions. A fork must run beside
its source under its own name and UUID, so :func:`restamp` rewrites the domain definition stored
*inside* the image instead, and libvirt then restores it as a new domain.

The layout (libvirt's ``src/qemu/qemu_saveimage.h``, version 2, in host byte order)::

    char     magic[16]        "LibvirtQemudSave" ("LibvirtQemudPart" while still being written)
    uint32_t version          2
    uint32_t data_len         bytes of the data area that follows the header
    uint32_t was_running
    uint32_t compressed
    uint32_t cookieOffset     where the cookie starts inside the data area
    uint32_t unused[14]
    data area: domain XML, NUL, cookie XML, NUL, zero padding up to data_len
    QEMU's migration stream

libvirt leaves the data area padded so the XML can be edited in place (what
``virDomainSaveImageDefineXML`` does); :func:`restamp` does the same, in place, and refuses an image
in any other format or one whose new XML does not fit. Only the name, the UUID and hostd's metadata
mark change, and only for domains whose guest sees nothing else of them: a domain with a network
interface (its MAC address) or a disk (its state lives outside the image) is refused.

What a fork's guest still shares with its source, being a copy of its memory: everything the guest
read at boot (its SMBIOS UUID among it) and its kernel's random state, until it reseeds.
"""

from __future__ import annotations

import os
import re
import struct
import xml.etree.ElementTree as ET
from pathlib import Path
from xml.sax.saxutils import escape

from . import domain

MAGIC = b"LibvirtQemudSave"
VERSION = 2
_HEADER = struct.Struct("=16s19I")  # magic + version, data_len, was_running, compressed, cookieOffset, unused[14]


class SaveImageError(Exception):
    """The image cannot be given another identity; the message says why."""


def _check_devices(dom: ET.Element) -> None:
    devices = dom.find("devices")
    if devices is None:
        return
    if devices.find("interface") is not None:
        raise SaveImageError("the domain has a network interface: its guest would keep the source's MAC address")
    if devices.find("disk") is not None:
        raise SaveImageError("the domain has a disk: its state is not in the memory image")


#: hostd's mark as libvirt writes it back: ``<PREFIX:instance xmlns:PREFIX="NS" .../>``.
_MARK = re.compile(
    r"<(?P<p>[A-Za-z_][\w.-]*):instance\b[^>]*?\sxmlns:(?P=p)=\"" + re.escape(domain.METADATA_NS) + r"\"[^>]*/>"
)


def _replace_once(pattern: str, value: str, xml: str, what: str) -> str:
    new, count = re.subn(pattern, value, xml, count=1)
    if count != 1:
        raise SaveImageError(f"the domain definition in the image has no {what}")
    return new


def _rewrite(xml: str, name: str, uuid: str, instance_id: str, namespace: str) -> str:
    """Edit the text libvirt wrote (its own formatting stays): name, UUID, hostd's mark."""
    try:
        _check_devices(ET.fromstring(xml))
    except ET.ParseError as exc:
        raise SaveImageError(f"the domain definition in the image is not XML: {exc}") from None
    xml = _replace_once(r"<name>[^<]*</name>", f"<name>{escape(name)}</name>", xml, "<name>")
    xml = _replace_once(r"<uuid>[^<]*</uuid>", f"<uuid>{escape(uuid)}</uuid>", xml, "<uuid>")
    mark = domain.mark_xml(instance_id, namespace)
    if _MARK.search(xml):
        xml = _MARK.sub(lambda _m: mark, xml, count=1)
    elif "<metadata>" in xml:
        xml = xml.replace("<metadata>", f"<metadata>{mark}", 1)
    else:
        xml = xml.replace("</uuid>", f"</uuid><metadata>{mark}</metadata>", 1)
    dom = ET.fromstring(xml)  # still well-formed, and says what we meant
    if dom.findtext("name") != name or dom.findtext("uuid") != uuid:
        raise SaveImageError("the domain definition in the image could not be rewritten")
    return xml


def restamp(path: Path, *, name: str, uuid: str, instance_id: str, namespace: str) -> None:
    """Give the save image at ``path`` a new domain name, UUID and metadata mark, in place.

    Raises :class:`SaveImageError` for an image that is not a complete version-2 QEMU save image,
    a domain that cannot be copied this way (see the module docstring), or an XML that no longer
    fits the image's data area. Blocking: call it from a worker thread.
    """
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        head = os.pread(fd, _HEADER.size, 0)
        if len(head) < _HEADER.size:
            raise SaveImageError("the file is shorter than a save image header")
        magic, version, data_len, *rest = _HEADER.unpack(head)
        cookie_offset = rest[2]
        if magic != MAGIC or version != VERSION:
            raise SaveImageError(f"not a complete libvirt QEMU save image (version {VERSION}): magic {magic!r}")
        data = os.pread(fd, data_len, _HEADER.size)
        if len(data) != data_len or cookie_offset > data_len:
            raise SaveImageError("the image's data area is truncated")
        xml = data[: cookie_offset or data_len].split(b"\0", 1)[0].decode()
        cookie = data[cookie_offset:].split(b"\0", 1)[0] if cookie_offset else b""
        new_xml = _rewrite(xml, name, uuid, instance_id, namespace).encode() + b"\0"
        body = new_xml + (cookie + b"\0" if cookie else b"")
        if len(body) > data_len:
            raise SaveImageError(f"the new definition ({len(body)} bytes) does not fit the image ({data_len})")
        fields = [version, data_len, *rest]
        fields[4] = len(new_xml) if cookie else 0  # cookieOffset
        header = _HEADER.pack(magic, *fields)
        os.pwrite(fd, header + body + bytes(data_len - len(body)), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
