"""The libvirt domain of a VM instance: the XML hostd defines, and the metadata that finds it again.

One template for every VM: the loadout's sizes (memory, vCPUs) and the instance's image fill it
in. What this machine needs (DESIGN.md §6): no ``<graphics>``, a ``<serial type='pty'>`` plus
``<console type='pty'>`` (the console session's stream), a ``<channel type='unix'>`` named
``org.qemu.guest_agent.0`` for qemu-guest-agent (task execs), and one named ``org.aiwg.agent.0``
for the agent channel (execs' control channels, :mod:`.agentmux`). The domain ``type`` is a setting:
``kvm`` in production, ``qemu`` (software emulation) where KVM guests do not run.

Every domain hostd defines carries ``<aiwg:instance>`` in its ``<metadata>`` (namespace
:data:`METADATA_NS`) with the instance id and hostd's namespace (the hash of its state dir, as in
process tree marks), so a restarted hostd finds its domains by metadata, never by name alone, and
two hostds on one libvirt never take each other's.

Built with ElementTree, so names and paths are escaped, never pasted into markup.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import msgspec

METADATA_NS = "https://agentic-sandbox.dev/hostd/vm/1"
METADATA_PREFIX = "aiwg"
GUEST_AGENT_CHANNEL = "org.qemu.guest_agent.0"
#: The agent channel's port: execs' control channels, multiplexed (:mod:`.agentmux`).
AGENT_CHANNEL = "org.aiwg.agent.0"


class DomainSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one domain's XML is made from."""

    name: str
    domain_type: str
    memory_mib: int
    vcpus: int
    instance_id: str
    namespace: str
    #: The warm pool the domain is a slot of (in its mark: a slot nobody holds is safe to remove).
    pool: str | None = None
    #: Direct boot: kernel, initrd and command line (all set) ...
    kernel: str | None = None
    initrd: str | None = None
    cmdline: str | None = None
    #: ... or a qcow2 disk, opened read-only with a throw-away overlay (``<transient/>``).
    disk: str | None = None


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrs)
    if text is not None:
        el.text = text
    return el


def domain_name(namespace: str, instance_id: str) -> str:
    """The name hostd gives an instance's domain (its hostd's namespace keeps two hostds apart)."""
    return f"aiwg-{namespace}-{instance_id}"


def mark_element(instance_id: str, namespace: str) -> str:
    """The mark alone, as ``virDomainSetMetadata`` takes it (libvirt adds the namespace)."""
    return ET.tostring(ET.Element("instance", {"id": instance_id, "namespace": namespace}), encoding="unicode")


def _mark(instance_id: str, namespace: str, pool: str | None = None) -> ET.Element:
    # The prefix and its declaration are plain text to ElementTree, so they are written as libvirt
    # expects them (on the element itself), not hoisted to the document's root.
    attrs = {f"xmlns:{METADATA_PREFIX}": METADATA_NS, "id": instance_id, "namespace": namespace}
    if pool is not None:
        attrs["pool"] = pool
    return ET.Element(f"{METADATA_PREFIX}:instance", attrs)


def mark_xml(instance_id: str, namespace: str) -> str:
    """The mark as it stands in a domain's ``<metadata>``, with its namespace declared on it."""
    return ET.tostring(_mark(instance_id, namespace), encoding="unicode")


def render(spec: DomainSpec) -> str:
    dom = ET.Element("domain", {"type": spec.domain_type})
    _sub(dom, "name", spec.name)
    meta = _sub(dom, "metadata")
    meta.append(_mark(spec.instance_id, spec.namespace, spec.pool))
    _sub(dom, "memory", str(spec.memory_mib), unit="MiB")
    _sub(dom, "vcpu", str(spec.vcpus))
    os_el = _sub(dom, "os")
    _sub(os_el, "type", "hvm", arch="x86_64", machine="pc")
    if spec.kernel is not None:
        _sub(os_el, "kernel", spec.kernel)
        if spec.initrd is not None:
            _sub(os_el, "initrd", spec.initrd)
        if spec.cmdline is not None:
            _sub(os_el, "cmdline", spec.cmdline)
    else:
        _sub(os_el, "boot", dev="hd")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "restart")
    _sub(dom, "on_crash", "destroy")
    devices = _sub(dom, "devices")
    if spec.disk is not None:
        disk = _sub(devices, "disk", type="file", device="disk")
        _sub(disk, "driver", name="qemu", type="qcow2")
        _sub(disk, "source", file=spec.disk)
        _sub(disk, "target", dev="vda", bus="virtio")
        _sub(disk, "transient")
    serial = _sub(devices, "serial", type="pty")
    _sub(serial, "target", port="0")
    console = _sub(devices, "console", type="pty")
    _sub(console, "target", type="serial", port="0")
    channel = _sub(devices, "channel", type="unix")
    _sub(channel, "source", mode="bind")
    _sub(channel, "target", type="virtio", name=GUEST_AGENT_CHANNEL)
    agent = _sub(devices, "channel", type="unix")
    _sub(agent, "source", mode="bind")  # libvirt picks the path; hostd reads it from the live XML
    _sub(agent, "target", type="virtio", name=AGENT_CHANNEL)
    _sub(devices, "memballoon", model="none")
    return ET.tostring(dom, encoding="unicode")


class DomainMark(msgspec.Struct, frozen=True):
    instance_id: str
    namespace: str
    #: Set while the domain is a warm pool slot nobody has claimed.
    pool: str | None = None


def parse_mark(metadata_xml: str) -> DomainMark | None:
    """Read the mark :func:`render` wrote, as ``virDomainGetMetadata`` returns it; None if
    it is not ours."""
    try:
        el = ET.fromstring(metadata_xml)
    except ET.ParseError:
        return None
    if el.tag.rsplit("}", 1)[-1] != "instance":
        return None
    iid, ns = el.get("id"), el.get("namespace")
    if not iid or not ns:
        return None
    return DomainMark(iid, ns, el.get("pool") or None)
