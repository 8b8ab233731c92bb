"""Machines behind a BMC, for real: a libvirt domain on the real-guest rig's libvirtd
(tests/realguest/rig.py) booting the tiny guest stands in for a physical server, and
``LibvirtBmc`` (tests/bmc/emulators.py) is its BMC, serving that domain alone over Redfish.

The domain has no disk and no NIC: what the BMC tests look at is its power, its CD-ROM and its
boot order, and its serial console, where the guest prints ``gpucap-guest: booted`` each time it
comes up (so a test can tell a restart from a machine that merely stayed on).
"""

import uuid
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import libvirt

from gpucap.bmc.redfish import BmcTarget
from tests.bmc.emulators import LibvirtBmc
from tests.realguest import rig

POOL = "gpucap"  # the rig's storage pool, where the emulator uploads inserted media
BOOTED = "gpucap-guest: booted"


@dataclass
class Server:
    """One machine and its BMC: ``name`` and ``uuid`` are the domain's, ``console`` its serial
    log, ``bmc`` the emulator serving it and ``target`` how gpucap's client reaches it."""

    name: str
    uuid: str
    uri: str
    console: Path
    bmc: LibvirtBmc
    target: BmcTarget

    def domain_state(self) -> int:
        """libvirt's word for the domain now (``libvirt.VIR_DOMAIN_RUNNING``, ``..._SHUTOFF``)."""
        with _connection(self.uri) as connection:
            return connection.lookupByUUIDString(self.uuid).state()[0]

    def domain_id(self) -> int:
        """The running domain's id: a new one each time the domain is started (-1 when off)."""
        with _connection(self.uri) as connection:
            return connection.lookupByUUIDString(self.uuid).ID()

    def domain_xml(self, *, live: bool = False) -> ET.Element:
        """The domain's persistent definition (what it boots with next), or with ``live`` the
        running QEMU process's."""
        with _connection(self.uri) as connection:
            domain = connection.lookupByUUIDString(self.uuid)
            flags = 0 if live else libvirt.VIR_DOMAIN_XML_INACTIVE
            return ET.fromstring(domain.XMLDesc(flags))

    def boots(self) -> int:
        """How many times the guest has come up since the domain was defined."""
        return (
            self.console.read_text(errors="replace").count(BOOTED) if self.console.exists() else 0
        )


@contextmanager
def server(node: rig.Node, image: rig.GuestImage, accel: str, name: str):
    """A running domain ``name`` on ``node`` and a ``LibvirtBmc`` serving it alone; the domain,
    its uploaded media and the emulator are gone afterwards."""
    domain_uuid = str(uuid.uuid4())
    console = node.console(name)
    with _connection(node.uri) as connection:
        domain = connection.defineXML(_domain_xml(name, domain_uuid, image, accel, console))
        domain.create()
    try:
        with LibvirtBmc(node.uri, pool=POOL, only=(domain_uuid,)) as bmc:
            target = BmcTarget(
                name=f"node {name}",
                address=bmc.url,
                username=bmc.username,
                password=bmc.password,
            )
            yield Server(
                name=name, uuid=domain_uuid, uri=node.uri, console=console, bmc=bmc, target=target
            )
    finally:
        _remove(node.uri, domain_uuid)


def _domain_xml(name: str, domain_uuid: str, image: rig.GuestImage, accel: str, console) -> str:
    domain = ET.Element("domain", type=accel)
    ET.SubElement(domain, "name").text = name
    ET.SubElement(domain, "uuid").text = domain_uuid
    ET.SubElement(domain, "memory", unit="MiB").text = "192"
    ET.SubElement(domain, "vcpu").text = "1"
    os = ET.SubElement(domain, "os")
    ET.SubElement(os, "type", arch="x86_64", machine="pc").text = "hvm"
    ET.SubElement(os, "kernel").text = str(image.kernel)
    ET.SubElement(os, "initrd").text = str(image.initrd)
    ET.SubElement(os, "cmdline").text = "console=ttyS0 quiet"
    if accel == "kvm":
        ET.SubElement(domain, "cpu", mode="host-passthrough")
    devices = ET.SubElement(domain, "devices")
    serial = ET.SubElement(devices, "serial", type="file")
    ET.SubElement(serial, "source", path=str(console), append="on")
    return ET.tostring(domain, encoding="unicode")


def _remove(uri: str, domain_uuid: str) -> None:
    """The domain, off and undefined, and the media the emulator uploaded for it (named after
    the domain's UUID in the pool)."""
    with _connection(uri) as connection:
        try:
            domain = connection.lookupByUUIDString(domain_uuid)
        except libvirt.libvirtError:
            domain = None
        if domain is not None:
            if domain.isActive():
                domain.destroy()
            domain.undefine()
        pool = connection.storagePoolLookupByName(POOL)
        pool.refresh(0)
        for volume in pool.listAllVolumes():
            if domain_uuid in volume.name():
                volume.delete(0)


@contextmanager
def _connection(uri: str):
    connection = libvirt.open(uri)
    try:
        yield connection
    finally:
        connection.close()
