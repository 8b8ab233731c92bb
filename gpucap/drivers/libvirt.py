"""The libvirt driver: one libvirt connection per GPU node, from the cluster's URI template
(``driver_settings["uri"]``, e.g. ``qemu+ssh://root@{node}/system``).

A VM is a persistent domain named by its instance id, with its GPUs passed through as PCI
host devices (see ``libvirt_xml``) and a disk of its own: a qcow2 overlay on the image, created
as a volume in the node's libvirt storage pool (``storage_pool``), so that creating and
deleting it works over the same connection as everything else, remote or local. Its NoCloud
seed (``seed``: SSH key, user-data, address) is a second volume there, ``<instance>.seed.iso``,
uploaded through the same connection and written afresh at every create (the address or the
tenant's key may have changed since the last boot); the overlay is kept until destroy.

A guest whose node has a guest subnet plugs into the node's guest bridge with the MAC and address
gpucap gave it; the domain's ``<metadata>`` records that address (and an inference replica's
endpoint), which ``status`` reports back. Such a guest reaches the metadata endpoint through
the node's proxy on 169.254.169.254 (docs/node-setup.md).

Connections (``libvirt_host``) are kept per URI for the life of the process and reused by
every driver object; the settings are ``libvirt_settings``. Keeping them saves an SSH handshake
per call, and it is what makes libvirt's built-in test hypervisor
(``test:///default``, used by the tests) work at all: its domains live inside the connection,
so a second connection to the same URI sees a fresh hypervisor. A connection that died is
replaced on the next call; a forked worker process starts with none.

Errors: failing to reach the hypervisor (connecting, a dropped connection, a timeout) is
``DriverUnavailable``, retried by the task; anything else libvirt refuses is ``DriverError``
carrying libvirt's own message.
"""

import logging
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import libvirt

from gpucap.drivers import libvirt_host as host
from gpucap.drivers.base import (
    MISSING,
    RUNNING,
    DriverError,
    DriverUnavailable,
    VmSpec,
    VmStatus,
    settings_parse,
)
from gpucap.drivers.fabric_manager import fabric_manager_for
from gpucap.drivers.libvirt_host import connections_close
from gpucap.drivers.libvirt_settings import LibvirtSettings
from gpucap.drivers.libvirt_xml import (
    domain_xml,
    fabric_partition_of,
    instance_metadata,
    overlay_volume_xml,
    raw_volume_xml,
)
from gpucap.drivers.seed import Seed, SeedError, seed_iso

__all__ = ["LibvirtDriver", "LibvirtSettings", "connections_close"]

logger = logging.getLogger(__name__)

_IMAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class LibvirtDriver:
    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.settings = settings_parse(LibvirtSettings, settings, driver="libvirt")

    def uri_for(self, node: str) -> str:
        return self.settings.uri.format(node=node)

    # --- the driver interface ------------------------------------------------------------------

    def create(self, spec: VmSpec) -> VmStatus:
        with self._connection(spec.node) as connection:
            domain = host.lookup(connection, spec.instance_id)
            if domain is not None and domain.isActive():
                return self._status(domain)
            image_path = self._image_path(connection, spec)
            # Defined (a retry, or a VM started again) or new: (re)define with the GPUs, address
            # and seed it has now, keeping its disk.
            disk_path = self._overlay(connection, spec.instance_id, spec.node, image_path)
            seed_path = self._seed(connection, spec)
            xml = domain_xml(
                spec,
                shape=self.settings.shape,
                disk_path=disk_path,
                image_path=image_path,
                seed_path=seed_path,
                uuid=None if domain is None else domain.UUIDString(),
            )
            domain = connection.defineXML(xml)
            self._fabric_partition(spec.node, domain, active=True, gpus=len(spec.gpus))
            host.power_on(domain)
            return self._status(domain)

    def stop(self, instance_id: str, node: str, *, grace_seconds: float | None = None) -> VmStatus:
        grace = self.settings.grace_seconds if grace_seconds is None else grace_seconds
        with self._connection(node) as connection:
            domain = host.lookup(connection, instance_id)
            if domain is None:
                return VmStatus(state=MISSING)
            if not host.domain_active(domain):
                self._fabric_partition(node, domain, active=False)  # a stop that died halfway
                return self._status(domain)
            # No guest agent channel in our domains, so this presses the ACPI power button.
            host.unless_off(domain, domain.shutdown)
            deadline = time.monotonic() + grace
            while host.domain_active(domain) and time.monotonic() < deadline:
                time.sleep(min(self.settings.poll_seconds, max(deadline - time.monotonic(), 0)))
            if not host.domain_active(domain):
                self._fabric_partition(node, domain, active=False)
                return self._status(domain)
            logger.warning(
                "%s on %s ignored the ACPI shutdown for %g s: forcing it off",
                instance_id,
                node,
                grace,
            )
            host.unless_off(domain, domain.destroy)
            self._fabric_partition(node, domain, active=False)
            status = self._status(domain)
            message = f"forced off: the guest did not shut down within {grace:g} s"
            return VmStatus(state=status.state, message=message)

    def start(self, instance_id: str, node: str) -> VmStatus:
        with self._connection(node) as connection:
            domain = host.lookup(connection, instance_id)
            if domain is None:
                raise DriverError(f"{instance_id} is not defined on {node}; create it first")
            if not domain.isActive():
                self._fabric_partition(node, domain, active=True)
                host.power_on(domain)
            return self._status(domain)

    def destroy(self, instance_id: str, node: str) -> VmStatus:
        with self._connection(node) as connection:
            domain = host.lookup(connection, instance_id)
            if domain is not None:
                if domain.isActive():
                    host.unless_off(domain, domain.destroy)
                self._fabric_partition(node, domain, active=False)  # before its record goes
                host.undefine(domain)
            # Also when the domain is already gone: a destroy that died halfway left the disk.
            self._volume_delete(connection, f"{instance_id}.qcow2")
            self._volume_delete(connection, f"{instance_id}{host.SEED_SUFFIX}")
            return VmStatus(state=MISSING)

    def status(self, instance_id: str, node: str) -> VmStatus:
        with self._connection(node) as connection:
            domain = host.lookup(connection, instance_id)
            return VmStatus(state=MISSING) if domain is None else self._status(domain)

    def hypervisor_answers(self, node: str) -> bool:
        """The node's libvirt, asked for its version within ``probe_timeout_seconds``; or, with
        ``probe_tcp_port`` set, the node's port (``gpucap.drivers.tcp_probe``)."""
        if self.settings.probe_by_tcp():
            return self.settings.probe_answers(node)
        return host.answers(self.uri_for(node), timeout=self.settings.probe_timeout_seconds)

    # --- inside ------------------------------------------------------------------------------

    def _fabric_partition(
        self, node: str, domain: libvirt.virDomain, *, active: bool, gpus: int = 0
    ) -> None:
        """Activate the VM's NVLink partition before its domain starts, or deactivate it once
        the domain is off, through the cluster's Fabric Manager (none: nothing to do). The
        partition is the one the domain's metadata records. A multi-GPU VM without one is
        refused rather than started without NVLink. A partition that another running domain
        records stays active: a VM stopped long ago (a spot VM keeping its disk) may name the
        partition a VM placed since on the same GPUs runs in."""
        fabric = fabric_manager_for(
            self.settings.fabric_manager,
            node,
            command=self.settings.fabric_manager_command,
            timeout_seconds=self.settings.fabric_manager_timeout_seconds,
        )
        if fabric is None:
            return
        partition = fabric_partition_of(domain.XMLDesc())
        if partition is None:
            if active and gpus > 1:
                raise DriverError(
                    f"{domain.name()} has {gpus} GPUs on {node} but no Fabric Manager partition: "
                    "import the node's partitions (manage.py fabric_partitions_import) so its "
                    "GPUs get NVLink"
                )
            return
        if active:
            fabric.activate(partition)
            return
        running = domain.connect().listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
        if not any(
            other.name() != domain.name() and fabric_partition_of(other.XMLDesc()) == partition
            for other in running
        ):
            fabric.deactivate(partition)

    @contextmanager
    def _connection(self, node: str) -> Iterator[libvirt.virConnect]:
        uri = self.uri_for(node)
        connection = host.connect(uri)
        try:
            yield connection
        except libvirt.libvirtError as error:
            message = error.get_error_message() or str(error)
            if host.unreachable(error):
                host.forget_if_dead(uri, connection)
                raise DriverUnavailable(f"libvirt on {node} ({uri}): {message}") from error
            raise DriverError(f"libvirt on {node}: {message}") from error

    def _image_path(self, connection: libvirt.virConnect, spec: VmSpec) -> str:
        """The base the VM's overlay backs onto: the catalogue's base image for this node (a
        path, or the name of a volume in the storage pool), else ``image_path`` filled in with
        the image's name."""
        if spec.base_image.startswith("/"):
            return spec.base_image
        if spec.base_image:
            volume = host.volume(self._pool(connection, spec.node), spec.base_image)
            if volume is None:
                raise DriverError(
                    f"node {spec.node} has no volume {spec.base_image!r} (image {spec.image}) "
                    f"in its storage pool {self.settings.storage_pool!r}"
                )
            return volume.path()
        if not _IMAGE_NAME.match(spec.image):
            raise DriverError(
                f"image {spec.image!r} is not a plain image name (letters, digits, '.', '_', '-')"
            )
        return self.settings.image_path.format(image=spec.image)

    def _pool(self, connection: libvirt.virConnect, node: str) -> libvirt.virStoragePool:
        pool = host.storage_pool(connection, self.settings.storage_pool)
        if pool is None:
            raise DriverError(
                f"node {node} has no libvirt storage pool {self.settings.storage_pool!r} for VM "
                "disks (define a dir pool there, or set driver_settings.storage_pool)"
            )
        return pool

    def _overlay(
        self, connection: libvirt.virConnect, instance_id: str, node: str, image_path: str
    ) -> str:
        """The VM's disk: kept across stop and start, created on first use."""
        pool = self._pool(connection, node)
        name = f"{instance_id}.qcow2"
        volume = host.volume(pool, name)
        if volume is None:
            xml = overlay_volume_xml(
                name, capacity_gib=self.settings.disk_gib, image_path=image_path
            )
            try:
                volume = pool.createXML(xml, 0)
            except libvirt.libvirtError:
                volume = host.volume(pool, name)  # created by a concurrent call: fine
                if volume is None:
                    raise
        return volume.path()

    def _seed(self, connection: libvirt.virConnect, spec: VmSpec) -> str:
        """The VM's NoCloud seed as it should be now, written over any older one."""
        if spec.network is not None and not spec.network.bridge:
            raise DriverError(
                f"node {spec.node} has a guest subnet but no guest bridge for {spec.instance_id}"
            )
        try:
            iso = seed_iso(
                Seed(
                    instance_id=spec.instance_id,
                    hostname=spec.instance_id,
                    ssh_public_key=spec.ssh_public_key,
                    user_data=spec.user_data,
                    network=spec.network,
                )
            )
        except SeedError as error:
            raise DriverError(f"{spec.instance_id}: {error}") from error
        pool = self._pool(connection, spec.node)
        name = f"{spec.instance_id}{host.SEED_SUFFIX}"
        volume = host.volume(pool, name)
        if volume is not None and volume.info()[1] != len(iso):
            host.ignoring(volume.delete, libvirt.VIR_ERR_NO_STORAGE_VOL, 0)
            volume = None
        if volume is None:
            try:
                volume = pool.createXML(raw_volume_xml(name, size=len(iso)), 0)
            except libvirt.libvirtError:
                volume = host.volume(pool, name)  # created by a concurrent call: fine
                if volume is None:
                    raise
        host.volume_write(connection, volume, iso)
        return volume.path()

    def _volume_delete(self, connection: libvirt.virConnect, name: str) -> None:
        pool = host.storage_pool(connection, self.settings.storage_pool)
        volume = None if pool is None else host.volume(pool, name)
        if volume is not None:
            host.ignoring(volume.delete, libvirt.VIR_ERR_NO_STORAGE_VOL, 0)

    def _status(self, domain: libvirt.virDomain) -> VmStatus:
        try:
            state, reason = domain.state()
        except libvirt.libvirtError as error:
            if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return VmStatus(state=MISSING)
            raise
        vm_state, message = host.vm_state(state, reason)
        if vm_state != RUNNING:
            return VmStatus(state=vm_state, message=message)
        recorded = instance_metadata(domain.XMLDesc())
        return VmStatus(
            state=vm_state,
            ip_address=recorded.get("address") or host.ip_address(domain),
            endpoint_url=recorded.get("endpoint") or None,
            message=message,
        )
