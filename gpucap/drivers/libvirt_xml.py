"""The libvirt domain XML for a GPU VM, built with ElementTree (never by pasting strings, so an
image name or SSH key comment cannot break out of its element).

The VM's GPUs are passed through as managed PCI host devices: libvirt detaches each card from
the host driver, binds it to vfio-pci for the guest and gives it back when the domain stops. A
cluster of rigs without GPUs to pass (CI) leaves them out (``DomainShape.gpu_passthrough``).

Besides its disk, a guest gets its NoCloud seed (``seed.py``) as a second, read-only virtio disk,
and, when gpucap gave it an address, one virtio NIC on its node's guest bridge with the MAC
gpucap chose; otherwise a NIC on a libvirt network whose DHCP hands out the address.
"""

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from gpucap.drivers.base import DriverError, VmSpec

# gpucap's own element in the domain's <metadata>: what the guest should be given at first boot.
METADATA_NAMESPACE = "urn:gpucap:libvirt:instance:1"
ET.register_namespace("gpucap", METADATA_NAMESPACE)

_PCI_ADDRESS = re.compile(
    r"^(?P<domain>[0-9a-f]{4}):(?P<bus>[0-9a-f]{2}):(?P<slot>[0-1][0-9a-f])\.(?P<function>[0-7])$"
)


@dataclass(frozen=True)
class DomainShape:
    """What every domain of a cluster looks like, per GPU and overall."""

    vcpus_per_gpu: int
    memory_gib_per_gpu: int
    domain_type: str = "kvm"  # or "qemu": software emulation (TCG), where KVM is unavailable
    machine: str = "q35"
    firmware: str = "efi"  # OVMF: data-centre GPUs' large BARs need it; or "bios"
    network: str = "default"
    gpu_passthrough: bool = True
    # Direct kernel boot, for images shipped as a kernel and an initrd (microVM-style images,
    # the CI rig's tiny guest); empty: the firmware boots the disk.
    kernel: str = ""
    initrd: str = ""
    cmdline: str = ""
    serial_log: str = ""  # the serial console to this file; empty: a pty (virsh console)


def domain_xml(
    spec: VmSpec,
    *,
    shape: DomainShape,
    disk_path: str,
    image_path: str,
    seed_path: str = "",
    uuid: str | None = None,
) -> str:
    """The domain for ``spec``: ``disk_path`` is the VM's own qcow2 overlay on ``image_path``,
    ``seed_path`` its NoCloud seed. Redefining an existing domain must repeat its ``uuid``; a new
    one gets libvirt's."""
    gpus = len(spec.gpus)
    domain = ET.Element("domain", type=shape.domain_type)
    ET.SubElement(domain, "name").text = spec.instance_id
    if uuid:
        ET.SubElement(domain, "uuid").text = uuid
    ET.SubElement(domain, "description").text = f"gpucap {spec.role} {spec.instance_id}"
    domain.append(_metadata(spec))
    ET.SubElement(domain, "memory", unit="GiB").text = str(gpus * shape.memory_gib_per_gpu)
    ET.SubElement(domain, "vcpu", placement="static").text = str(gpus * shape.vcpus_per_gpu)
    domain.append(_os(shape, image=spec.image))
    features = ET.SubElement(domain, "features")
    ET.SubElement(features, "acpi")  # the guest hears the ACPI power button: graceful stop
    ET.SubElement(features, "apic")
    if shape.domain_type == "kvm":  # emulation (TCG) has no host CPU to pass through
        ET.SubElement(domain, "cpu", mode="host-passthrough", check="none")
    ET.SubElement(domain, "on_poweroff").text = "destroy"
    ET.SubElement(domain, "on_reboot").text = "restart"
    ET.SubElement(domain, "on_crash").text = "destroy"
    devices = ET.SubElement(domain, "devices")
    devices.append(_disk(disk_path, image_path))
    if seed_path:
        devices.append(_seed_disk(seed_path))
    devices.append(_interface(spec, shape))
    if shape.gpu_passthrough:
        for gpu in spec.gpus:
            devices.append(_hostdev(gpu.pci_address))
    devices.extend(_consoles(shape.serial_log.format(instance=spec.instance_id)))
    ET.indent(domain)
    return ET.tostring(domain, encoding="unicode")


def endpoint_url(spec: VmSpec) -> str:
    """Where an inference replica's model server listens: its gpucap address and its image's
    port; "" when either is unknown (the address then comes from the hypervisor)."""
    if spec.network is None or spec.service_port is None:
        return ""
    address = spec.network.address.split("/")[0]
    return f"http://{address}:{spec.service_port}"


def instance_metadata(xml: str) -> dict[str, str]:
    """What gpucap wrote into a domain's ``<metadata>`` (as ``domain_xml`` writes it), by tag."""
    instance = ET.fromstring(xml).find(f"metadata/{_gpucap('instance')}")
    if instance is None:
        return {}
    prefix = f"{{{METADATA_NAMESPACE}}}"
    return {
        child.tag.removeprefix(prefix): child.text or ""
        for child in instance
        if child.tag.startswith(prefix) and len(child) == 0
    }


def overlay_volume_xml(name: str, *, capacity_gib: int, image_path: str) -> str:
    """A storage volume: the VM's own copy-on-write qcow2 over the shared image."""
    volume = ET.Element("volume")
    ET.SubElement(volume, "name").text = name
    ET.SubElement(volume, "capacity", unit="GiB").text = str(capacity_gib)
    target = ET.SubElement(volume, "target")
    ET.SubElement(target, "format", type="qcow2")
    backing = ET.SubElement(volume, "backingStore")
    ET.SubElement(backing, "path").text = image_path
    ET.SubElement(backing, "format", type="qcow2")
    ET.indent(volume)
    return ET.tostring(volume, encoding="unicode")


def raw_volume_xml(name: str, *, size: int) -> str:
    """A storage volume of ``size`` bytes holding a raw image (the seed ISO)."""
    volume = ET.Element("volume")
    ET.SubElement(volume, "name").text = name
    ET.SubElement(volume, "capacity", unit="bytes").text = str(size)
    ET.SubElement(volume, "allocation", unit="bytes").text = str(size)
    target = ET.SubElement(volume, "target")
    ET.SubElement(target, "format", type="raw")
    ET.indent(volume)
    return ET.tostring(volume, encoding="unicode")


def pci_address_parts(pci_address: str) -> dict[str, str]:
    """``"0000:18:00.0"`` -> libvirt's ``<address>`` attributes: domain, bus, slot, function."""
    match = _PCI_ADDRESS.match(pci_address.lower())
    if not match:
        raise DriverError(
            f"GPU PCI address {pci_address!r} is not of the form dddd:bb:ss.f (e.g. 0000:18:00.0)"
        )
    return {name: f"0x{value}" for name, value in match.groupdict().items()}


def _metadata(spec: VmSpec) -> ET.Element:
    """Cloud-init-style first-boot data; a guest agent or the metadata service hands it over."""
    metadata = ET.Element("metadata")
    instance = ET.SubElement(metadata, _gpucap("instance"))
    ET.SubElement(instance, _gpucap("instance-id")).text = spec.instance_id
    ET.SubElement(instance, _gpucap("role")).text = spec.role
    ET.SubElement(instance, _gpucap("image")).text = spec.image
    ET.SubElement(instance, _gpucap("ssh-authorized-key")).text = spec.ssh_public_key
    if spec.network is not None:
        ET.SubElement(instance, _gpucap("address")).text = spec.network.address.split("/")[0]
    if endpoint_url(spec):
        ET.SubElement(instance, _gpucap("endpoint")).text = endpoint_url(spec)
    gpus = ET.SubElement(instance, _gpucap("gpus"))
    for gpu in spec.gpus:
        ET.SubElement(
            gpus, _gpucap("gpu"), index=str(gpu.index), uuid=gpu.uuid, pci=gpu.pci_address
        )
    if spec.fabric_partition is not None:
        # stop and destroy get only the VM's name: they read the partition to deactivate here.
        ET.SubElement(instance, _gpucap("fabric-partition")).text = str(spec.fabric_partition)
    return metadata


def fabric_partition_of(xml: str) -> int | None:
    """The Fabric Manager partition a domain's metadata records (see ``_metadata``), or None."""
    text = ET.fromstring(xml).findtext(
        f"metadata/{_gpucap('instance')}/{_gpucap('fabric-partition')}"
    )
    return None if text is None else int(text)


def _disk(disk_path: str, image_path: str) -> ET.Element:
    disk = ET.Element("disk", type="file", device="disk")
    ET.SubElement(disk, "driver", name="qemu", type="qcow2", discard="unmap")
    ET.SubElement(disk, "source", file=disk_path)
    backing = ET.SubElement(disk, "backingStore", type="file")
    ET.SubElement(backing, "format", type="qcow2")
    ET.SubElement(backing, "source", file=image_path)
    ET.SubElement(disk, "target", dev="vda", bus="virtio")
    return disk


def _seed_disk(seed_path: str) -> ET.Element:
    """The NoCloud seed: an ISO 9660 image labelled ``cidata``, read-only, as cloud-init looks for
    it on any block device."""
    disk = ET.Element("disk", type="file", device="disk")
    ET.SubElement(disk, "driver", name="qemu", type="raw")
    ET.SubElement(disk, "source", file=seed_path)
    ET.SubElement(disk, "target", dev="vdb", bus="virtio")
    ET.SubElement(disk, "readonly")
    return disk


def _os(shape: DomainShape, *, image: str) -> ET.Element:
    if not shape.kernel:
        os = ET.Element("os", firmware=shape.firmware)
        ET.SubElement(os, "type", arch="x86_64", machine=shape.machine).text = "hvm"
        return os
    os = ET.Element("os")
    ET.SubElement(os, "type", arch="x86_64", machine=shape.machine).text = "hvm"
    ET.SubElement(os, "kernel").text = shape.kernel.format(image=image)
    if shape.initrd:
        ET.SubElement(os, "initrd").text = shape.initrd.format(image=image)
    if shape.cmdline:
        ET.SubElement(os, "cmdline").text = shape.cmdline
    return os


def _interface(spec: VmSpec, shape: DomainShape) -> ET.Element:
    if spec.network is None:
        interface = ET.Element("interface", type="network")
        ET.SubElement(interface, "source", network=shape.network)
    else:
        interface = ET.Element("interface", type="bridge")
        ET.SubElement(interface, "source", bridge=spec.network.bridge)
        ET.SubElement(interface, "mac", address=spec.network.mac.lower())
    ET.SubElement(interface, "model", type="virtio")
    return interface


def _consoles(serial_log: str) -> list[ET.Element]:
    if not serial_log:
        return [ET.Element("serial", type="pty"), ET.Element("console", type="pty")]
    serial = ET.Element("serial", type="file")
    ET.SubElement(serial, "source", path=serial_log, append="on")
    return [serial]


def _hostdev(pci_address: str) -> ET.Element:
    hostdev = ET.Element("hostdev", mode="subsystem", type="pci", managed="yes")
    source = ET.SubElement(hostdev, "source")
    ET.SubElement(source, "address", **pci_address_parts(pci_address))
    return hostdev


def _gpucap(tag: str) -> str:
    return f"{{{METADATA_NAMESPACE}}}{tag}"
