"""The domain template and its metadata mark, in memory."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from agentic_sandbox.hostd.providers.libvirt import domain

SPEC = domain.DomainSpec(
    name="aiwg-ns-i1",
    domain_type="qemu",
    memory_mib=192,
    vcpus=1,
    instance_id="i1",
    namespace="ns",
    kernel="/img/vmlinuz",
    initrd="/img/initrd <&>.img",
    cmdline="console=ttyS0",
)


def test_direct_boot_domain_has_what_this_machine_needs() -> None:
    root = ET.fromstring(domain.render(SPEC))
    assert root.get("type") == "qemu" and root.findtext("name") == "aiwg-ns-i1"
    assert root.findtext("os/kernel") == "/img/vmlinuz"
    assert root.findtext("os/initrd") == "/img/initrd <&>.img"  # escaped, not pasted into the markup
    assert root.find("devices/graphics") is None
    assert root.find("devices/serial[@type='pty']") is not None
    assert root.find("devices/console[@type='pty']") is not None
    channel = root.find("devices/channel[@type='unix']/target")
    assert channel is not None and channel.get("name") == domain.GUEST_AGENT_CHANNEL
    assert root.find("devices/disk") is None


def test_disk_boot_uses_a_transient_overlay() -> None:
    spec = domain.DomainSpec(
        name="d", domain_type="kvm", memory_mib=512, vcpus=2, instance_id="i", namespace="n", disk="/img/a.qcow2"
    )
    root = ET.fromstring(domain.render(spec))
    assert root.find("os/kernel") is None and root.find("os/boot").get("dev") == "hd"
    assert root.find("devices/disk/source").get("file") == "/img/a.qcow2"
    assert root.find("devices/disk/transient") is not None
    assert root.findtext("vcpu") == "2" and root.find("memory").text == "512"


def test_mark_round_trip() -> None:
    root = ET.fromstring(domain.render(SPEC))
    [mark] = list(root.find("metadata"))
    assert domain.parse_mark(ET.tostring(mark, encoding="unicode")) == domain.DomainMark("i1", "ns")
    assert domain.parse_mark(f'<instance xmlns="{domain.METADATA_NS}" id="i2" namespace="n2"/>') == (
        domain.DomainMark("i2", "n2")
    )
    assert domain.parse_mark("<other id='x' namespace='y'/>") is None
    assert domain.parse_mark("<instance id='x'/>") is None
    assert domain.parse_mark("not xml <") is None
