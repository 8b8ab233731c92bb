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

Connections are kept per URI for the life of the process and reused by every driver object.
That saves an SSH handshake per call, and it is what makes libvirt's built-in test hypervisor
(``test:///default``, used by the tests) work at all: its domains live inside the connection,
so a second connection to the same URI sees a fresh hypervisor. A connection that died is
replaced on the next call; a forked worker process starts with none.

Errors: failing to reach the hypervisor (connecting, a dropped connection, a timeout) is
``DriverUnavailable``, retried by the task; anything else libvirt refuses is ``DriverError``
carrying libvirt's own message.
"""

import logging
import os
import re
import string
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import libvirt

from gpucap.drivers.base import (
    BOOTING,
    FAILED,
    MISSING,
    RUNNING,
    STOPPED,
    STOPPING,
    DriverError,
    DriverUnavailable,
    VmSpec,
    VmStatus,
    settings_parse,
)
from gpucap.drivers.fabric_manager import (
    DEFAULT_COMMAND,
    command_problem,
    fabric_manager_for,
    fabric_manager_problem,
)
from gpucap.drivers.libvirt_xml import (
    DomainShape,
    domain_xml,
    fabric_partition_of,
    instance_metadata,
    overlay_volume_xml,
    raw_volume_xml,
)
from gpucap.drivers.seed import Seed, SeedError, seed_iso

logger = logging.getLogger(__name__)

_IMAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def _template(*, allowed: set[str], required: frozenset[str] = frozenset(), empty: bool = False):
    """A check for a setting that is a ``str.format`` template with these placeholders (or, if
    ``empty``, nothing: the feature is off)."""

    def problem(template: str) -> str:
        if empty and template == "":
            return ""
        if not template.strip():
            return "must not be empty"
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(template) if name}
        except ValueError as error:
            return f"is not a valid template: {error}"
        if names - allowed:
            unknown, known = sorted(names - allowed)[0], ", ".join(f"{{{n}}}" for n in allowed)
            return f"unknown placeholder {{{unknown}}} (it may use {known})"
        if required - names:
            return f"must contain {{{sorted(required - names)[0]}}}"
        return ""

    return problem


def _one_of(*choices: str):
    def problem(value: str) -> str:
        return "" if value in choices else f"must be one of {', '.join(choices)}, got {value!r}"

    return problem


@dataclass(frozen=True)
class LibvirtSettings:
    uri: str = field(
        metadata={
            "example": "qemu+ssh://root@{node}/system",
            "check": _template(allowed={"node"}),
        }
    )
    vcpus_per_gpu: int = field(default=8, metadata={"minimum": 1})
    memory_gib_per_gpu: int = field(default=64, metadata={"minimum": 1})
    image_path: str = field(
        default="/var/lib/gpucap/images/{image}.qcow2",
        metadata={"check": _template(allowed={"image"}, required=frozenset({"image"}))},
    )
    storage_pool: str = "gpucap"  # a dir pool on every node, e.g. /var/lib/gpucap/vms
    disk_gib: int = field(default=100, metadata={"minimum": 1})
    network: str = "default"
    domain_type: str = "kvm"
    machine: str = "q35"
    firmware: str = field(default="efi", metadata={"check": _one_of("efi", "bios")})
    grace_seconds: float = field(default=30.0, metadata={"minimum": 0})
    poll_seconds: float = field(default=1.0, metadata={"minimum": 0.01})
    # False leaves the GPUs out of every domain: for rigs with no GPUs to pass (CI, a lab), so
    # everything else runs for real. Never on a production cluster; its page says so.
    gpu_passthrough: bool = True
    # Images shipped as a kernel and an initrd boot them directly (templates on {image}).
    kernel_path: str = field(
        default="", metadata={"check": _template(allowed={"image"}, empty=True)}
    )
    initrd_path: str = field(
        default="", metadata={"check": _template(allowed={"image"}, empty=True)}
    )
    kernel_cmdline: str = "console=ttyS0"
    # Each guest's serial console to a file on its node ({instance}); empty: a pty.
    serial_log_path: str = field(
        default="", metadata={"check": _template(allowed={"instance"}, empty=True)}
    )
    # Shared-NVSwitch nodes: who activates a VM's NVLink partition (see fabric_manager).
    fabric_manager: str = field(default="none", metadata={"check": fabric_manager_problem})
    fabric_manager_command: list = field(
        default_factory=lambda: list(DEFAULT_COMMAND), metadata={"check": command_problem}
    )
    fabric_manager_timeout_seconds: float = field(default=60.0, metadata={"minimum": 1})

    @property
    def shape(self) -> DomainShape:
        return DomainShape(
            vcpus_per_gpu=self.vcpus_per_gpu,
            memory_gib_per_gpu=self.memory_gib_per_gpu,
            domain_type=self.domain_type,
            machine=self.machine,
            firmware=self.firmware,
            network=self.network,
            gpu_passthrough=self.gpu_passthrough,
            kernel=self.kernel_path,
            initrd=self.initrd_path,
            cmdline=self.kernel_cmdline if self.kernel_path else "",
            serial_log=self.serial_log_path,
        )


class LibvirtDriver:
    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.settings = settings_parse(LibvirtSettings, settings, driver="libvirt")

    def uri_for(self, node: str) -> str:
        return self.settings.uri.format(node=node)

    # --- the driver interface ------------------------------------------------------------------

    def create(self, spec: VmSpec) -> VmStatus:
        with self._connection(spec.node) as connection:
            domain = _lookup(connection, spec.instance_id)
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
            _power_on(domain)
            return self._status(domain)

    def stop(self, instance_id: str, node: str, *, grace_seconds: float | None = None) -> VmStatus:
        grace = self.settings.grace_seconds if grace_seconds is None else grace_seconds
        with self._connection(node) as connection:
            domain = _lookup(connection, instance_id)
            if domain is None:
                return VmStatus(state=MISSING)
            if not _domain_active(domain):
                self._fabric_partition(node, domain, active=False)  # a stop that died halfway
                return self._status(domain)
            # No guest agent channel in our domains, so this presses the ACPI power button.
            _unless_off(domain, domain.shutdown)
            deadline = time.monotonic() + grace
            while _domain_active(domain) and time.monotonic() < deadline:
                time.sleep(min(self.settings.poll_seconds, max(deadline - time.monotonic(), 0)))
            if not _domain_active(domain):
                self._fabric_partition(node, domain, active=False)
                return self._status(domain)
            logger.warning(
                "%s on %s ignored the ACPI shutdown for %g s: forcing it off",
                instance_id,
                node,
                grace,
            )
            _unless_off(domain, domain.destroy)
            self._fabric_partition(node, domain, active=False)
            status = self._status(domain)
            message = f"forced off: the guest did not shut down within {grace:g} s"
            return VmStatus(state=status.state, message=message)

    def start(self, instance_id: str, node: str) -> VmStatus:
        with self._connection(node) as connection:
            domain = _lookup(connection, instance_id)
            if domain is None:
                raise DriverError(f"{instance_id} is not defined on {node}; create it first")
            if not domain.isActive():
                self._fabric_partition(node, domain, active=True)
                _power_on(domain)
            return self._status(domain)

    def destroy(self, instance_id: str, node: str) -> VmStatus:
        with self._connection(node) as connection:
            domain = _lookup(connection, instance_id)
            if domain is not None:
                if domain.isActive():
                    _unless_off(domain, domain.destroy)
                self._fabric_partition(node, domain, active=False)  # before its record goes
                _undefine(domain)
            # Also when the domain is already gone: a destroy that died halfway left the disk.
            self._volume_delete(connection, f"{instance_id}.qcow2")
            self._volume_delete(connection, f"{instance_id}{SEED_SUFFIX}")
            return VmStatus(state=MISSING)

    def status(self, instance_id: str, node: str) -> VmStatus:
        with self._connection(node) as connection:
            domain = _lookup(connection, instance_id)
            return VmStatus(state=MISSING) if domain is None else self._status(domain)

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
        connection = _connect(uri)
        try:
            yield connection
        except libvirt.libvirtError as error:
            message = error.get_error_message() or str(error)
            if _unreachable(error):
                _forget_if_dead(uri, connection)
                raise DriverUnavailable(f"libvirt on {node} ({uri}): {message}") from error
            raise DriverError(f"libvirt on {node}: {message}") from error

    def _image_path(self, connection: libvirt.virConnect, spec: VmSpec) -> str:
        """The base the VM's overlay backs onto: the catalogue's base image for this node (a
        path, or the name of a volume in the storage pool), else ``image_path`` filled in with
        the image's name."""
        if spec.base_image.startswith("/"):
            return spec.base_image
        if spec.base_image:
            volume = _volume(self._pool(connection, spec.node), spec.base_image)
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
        pool = _storage_pool(connection, self.settings.storage_pool)
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
        volume = _volume(pool, name)
        if volume is None:
            xml = overlay_volume_xml(
                name, capacity_gib=self.settings.disk_gib, image_path=image_path
            )
            try:
                volume = pool.createXML(xml, 0)
            except libvirt.libvirtError:
                volume = _volume(pool, name)  # created by a concurrent call: fine
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
        name = f"{spec.instance_id}{SEED_SUFFIX}"
        volume = _volume(pool, name)
        if volume is not None and volume.info()[1] != len(iso):
            _ignoring(volume.delete, libvirt.VIR_ERR_NO_STORAGE_VOL, 0)
            volume = None
        if volume is None:
            try:
                volume = pool.createXML(raw_volume_xml(name, size=len(iso)), 0)
            except libvirt.libvirtError:
                volume = _volume(pool, name)  # created by a concurrent call: fine
                if volume is None:
                    raise
        volume_write(connection, volume, iso)
        return volume.path()

    def _volume_delete(self, connection: libvirt.virConnect, name: str) -> None:
        pool = _storage_pool(connection, self.settings.storage_pool)
        volume = None if pool is None else _volume(pool, name)
        if volume is not None:
            _ignoring(volume.delete, libvirt.VIR_ERR_NO_STORAGE_VOL, 0)

    def _status(self, domain: libvirt.virDomain) -> VmStatus:
        try:
            state, reason = domain.state()
        except libvirt.libvirtError as error:
            if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return VmStatus(state=MISSING)
            raise
        vm_state, message = _vm_state(state, reason)
        if vm_state != RUNNING:
            return VmStatus(state=vm_state, message=message)
        recorded = instance_metadata(domain.XMLDesc())
        return VmStatus(
            state=vm_state,
            ip_address=recorded.get("address") or _ip_address(domain),
            endpoint_url=recorded.get("endpoint") or None,
            message=message,
        )


# --- connections -------------------------------------------------------------------------------

_connections: dict[str, libvirt.virConnect] = {}
_connections_lock = threading.Lock()

# Errors that say "the hypervisor could not be reached", not "it said no".
_UNREACHABLE_CODES = {
    libvirt.VIR_ERR_NO_CONNECT,
    libvirt.VIR_ERR_INVALID_CONN,
    libvirt.VIR_ERR_RPC,
    libvirt.VIR_ERR_OPERATION_TIMEOUT,
    libvirt.VIR_ERR_AUTH_UNAVAILABLE,
}
_UNREACHABLE_DOMAINS = {libvirt.VIR_FROM_RPC, libvirt.VIR_FROM_REMOTE, libvirt.VIR_FROM_SSH}


def _connect(uri: str) -> libvirt.virConnect:
    with _connections_lock:
        connection = _connections.get(uri)
        if connection is not None and _alive(connection):
            return connection
        try:
            connection = libvirt.open(uri)
        except libvirt.libvirtError as error:
            message = error.get_error_message() or str(error)
            raise DriverUnavailable(f"cannot connect to libvirt at {uri}: {message}") from error
        _connections[uri] = connection
        return connection


def _alive(connection: libvirt.virConnect) -> bool:
    try:
        return connection.isAlive() == 1
    except libvirt.libvirtError:
        return False


def _forget_if_dead(uri: str, connection: libvirt.virConnect) -> None:
    if _alive(connection):
        return
    with _connections_lock:
        if _connections.get(uri) is connection:
            del _connections[uri]
    _ignoring(connection.close)


def _unreachable(error: libvirt.libvirtError) -> bool:
    return (
        error.get_error_code() in _UNREACHABLE_CODES
        or error.get_error_domain() in _UNREACHABLE_DOMAINS
    )


def connections_close() -> None:
    """Close every kept connection (a worker shutting down; tests wanting a fresh test
    hypervisor)."""
    with _connections_lock:
        kept = list(_connections.values())
        _connections.clear()
    for connection in kept:
        _ignoring(connection.close)


def _after_fork_in_child() -> None:
    # A forked Celery worker must not use (or close) its parent's sockets: it opens its own.
    global _connections_lock
    _connections_lock = threading.Lock()
    _connections.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
# libvirt prints every error to stderr by default; we raise them instead.
libvirt.registerErrorHandler(lambda _context, _error: None, None)


# --- domains -----------------------------------------------------------------------------------


def _lookup(connection: libvirt.virConnect, name: str) -> libvirt.virDomain | None:
    try:
        return connection.lookupByName(name)
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


def _power_on(domain: libvirt.virDomain) -> None:
    try:
        domain.create()
    except libvirt.libvirtError:
        if not domain.isActive():
            raise
        # Started by a concurrent call: what we wanted.


def _undefine(domain: libvirt.virDomain) -> None:
    flags = (
        libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
        | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
        | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
        | libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA
    )
    try:
        domain.undefineFlags(flags)
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return
        if error.get_error_code() != libvirt.VIR_ERR_INVALID_ARG:
            raise
        # A hypervisor without NVRAM or snapshots (the test driver) refuses those flags.
        _ignoring(domain.undefine, libvirt.VIR_ERR_NO_DOMAIN)


def _unless_off(domain: libvirt.virDomain, action) -> None:
    """Shut down or power off ``domain``; if it went off (or away) meanwhile, that will do."""
    try:
        action()
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return
        if _unreachable(error) or _domain_active(domain):
            raise


def _domain_active(domain: libvirt.virDomain) -> bool:
    try:
        return bool(domain.isActive())
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return False
        raise


def _ignoring(action, code: int | None = None, *args) -> None:
    """Run ``action``; an error with ``code`` (any error if None) is what we wanted anyway."""
    try:
        action(*args)
    except libvirt.libvirtError as error:
        if code is not None and error.get_error_code() != code:
            raise


# libvirt domain state (and reason) -> the driver's VM state, with a message for people.
def _vm_state(state: int, reason: int) -> tuple[str, str]:
    if state in (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_BLOCKED):
        return RUNNING, ""
    if state == libvirt.VIR_DOMAIN_NOSTATE:
        return BOOTING, ""
    if state == libvirt.VIR_DOMAIN_PAUSED:
        if reason == libvirt.VIR_DOMAIN_PAUSED_STARTING_UP:
            return BOOTING, ""
        if reason in (libvirt.VIR_DOMAIN_PAUSED_IOERROR, libvirt.VIR_DOMAIN_PAUSED_CRASHED):
            return FAILED, "paused by the hypervisor after an I/O error or a guest crash"
        return RUNNING, "paused by the hypervisor"
    if state == libvirt.VIR_DOMAIN_SHUTDOWN:
        return STOPPING, ""
    if state == libvirt.VIR_DOMAIN_SHUTOFF:
        if reason == libvirt.VIR_DOMAIN_SHUTOFF_CRASHED:
            return FAILED, "the guest crashed"
        if reason == libvirt.VIR_DOMAIN_SHUTOFF_FAILED:
            return FAILED, "the hypervisor could not start the domain"
        return STOPPED, ""
    if state == libvirt.VIR_DOMAIN_CRASHED:
        return FAILED, "the guest crashed"
    if state == libvirt.VIR_DOMAIN_PMSUSPENDED:
        return RUNNING, "suspended by the guest"
    return FAILED, f"unknown libvirt domain state {state}"


def _ip_address(domain: libvirt.virDomain) -> str | None:
    """The guest's address from the network's DHCP leases, else from a guest agent; None when
    neither knows yet (or the hypervisor cannot say)."""
    for source in (
        libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
        libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
    ):
        try:
            interfaces = domain.interfaceAddresses(source) or {}
        except libvirt.libvirtError as error:
            if _unreachable(error):
                raise
            continue
        addresses = [
            address for interface in interfaces.values() for address in interface.get("addrs") or []
        ]
        for family in (libvirt.VIR_IP_ADDR_TYPE_IPV4, libvirt.VIR_IP_ADDR_TYPE_IPV6):
            for address in addresses:
                if address["type"] == family and not address["addr"].startswith(("127.", "fe80:")):
                    return address["addr"]
    return None


# --- storage -----------------------------------------------------------------------------------

SEED_SUFFIX = ".seed.iso"


def volume_write(
    connection: libvirt.virConnect, volume: libvirt.virStorageVol, data: bytes
) -> None:
    """Write ``data`` over ``volume`` through the connection (so it works on a remote node)."""
    stream = connection.newStream(0)
    try:
        volume.upload(stream, 0, len(data), 0)
        for start in range(0, len(data), _UPLOAD_CHUNK):
            chunk = data[start : start + _UPLOAD_CHUNK]
            while chunk:
                sent = stream.send(chunk)
                chunk = chunk[sent:]
        stream.finish()
    except libvirt.libvirtError:
        _ignoring(stream.abort)
        raise


_UPLOAD_CHUNK = 256 * 1024


def _storage_pool(connection: libvirt.virConnect, name: str) -> libvirt.virStoragePool | None:
    try:
        return connection.storagePoolLookupByName(name)
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_POOL:
            return None
        raise


def _volume(pool: libvirt.virStoragePool, name: str) -> libvirt.virStorageVol | None:
    try:
        return pool.storageVolLookupByName(name)
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise
