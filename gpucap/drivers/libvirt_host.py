"""What the libvirt driver asks of libvirt itself, below the driver interface: one kept connection
per URI (replaced when it dies, none inherited by a forked worker), domain lookups and power
actions that tolerate a concurrent caller, libvirt's domain states read as the driver's VM
states, and the node's storage pool (volumes found, written through the connection).

An error that says the hypervisor could not be reached (``unreachable``) is the caller's cue
for ``DriverUnavailable``; anything else libvirt refuses is raised as libvirt raised it.
"""

import os
import threading

import libvirt

from gpucap.drivers.base import (
    BOOTING,
    FAILED,
    RUNNING,
    STOPPED,
    STOPPING,
    DriverUnavailable,
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


def connect(uri: str) -> libvirt.virConnect:
    """The kept connection to ``uri``, or a new one. Opened outside the lock: a host that
    takes its time to answer (an SSH handshake, a hung libvirtd) holds up only its own
    callers, never those of other nodes."""
    with _connections_lock:
        connection = _connections.get(uri)
        if connection is not None and _alive(connection):
            return connection
    try:
        opened = libvirt.open(uri)
    except libvirt.libvirtError as error:
        message = error.get_error_message() or str(error)
        raise DriverUnavailable(f"cannot connect to libvirt at {uri}: {message}") from error
    with _connections_lock:
        connection = _connections.get(uri)
        if connection is not None and _alive(connection):
            ignoring(opened.close)  # another caller opened one meanwhile: keep theirs
            return connection
        _connections[uri] = opened
        return opened


def answers(uri: str, *, timeout: float) -> bool:
    """Whether the hypervisor at ``uri`` answers: its connection (kept, or opened) asked for
    libvirt's version within ``timeout`` seconds. A probe still waiting by then counts as no
    answer; it is left to end on its own in its thread, and the connection it waits on is no
    longer handed out, so the next caller opens a fresh one."""
    done = threading.Event()
    answered: list[bool] = []

    def probe() -> None:
        try:
            connection = connect(uri)
            try:
                connection.getLibVersion()
                answered.append(True)
            except libvirt.libvirtError:
                forget_if_dead(uri, connection)
        except DriverUnavailable:
            pass
        finally:
            done.set()

    threading.Thread(target=probe, name=f"hypervisor probe {uri}", daemon=True).start()
    if done.wait(timeout):
        return bool(answered)
    with _connections_lock:
        _connections.pop(uri, None)
    return False


def _alive(connection: libvirt.virConnect) -> bool:
    try:
        return connection.isAlive() == 1
    except libvirt.libvirtError:
        return False


def forget_if_dead(uri: str, connection: libvirt.virConnect) -> None:
    if _alive(connection):
        return
    with _connections_lock:
        if _connections.get(uri) is connection:
            del _connections[uri]
    ignoring(connection.close)


def unreachable(error: libvirt.libvirtError) -> bool:
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
        ignoring(connection.close)


def _after_fork_in_child() -> None:
    # A forked Celery worker must not use (or close) its parent's sockets: it opens its own.
    global _connections_lock
    _connections_lock = threading.Lock()
    _connections.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
# libvirt prints every error to stderr by default; we raise them instead.
libvirt.registerErrorHandler(lambda _context, _error: None, None)


# --- domains -----------------------------------------------------------------------------------


def lookup(connection: libvirt.virConnect, name: str) -> libvirt.virDomain | None:
    try:
        return connection.lookupByName(name)
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


def power_on(domain: libvirt.virDomain) -> None:
    try:
        domain.create()
    except libvirt.libvirtError:
        if not domain.isActive():
            raise
        # Started by a concurrent call: what we wanted.


def undefine(domain: libvirt.virDomain) -> None:
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
        ignoring(domain.undefine, libvirt.VIR_ERR_NO_DOMAIN)


def unless_off(domain: libvirt.virDomain, action) -> None:
    """Shut down or power off ``domain``; if it went off (or away) meanwhile, that will do."""
    try:
        action()
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return
        if unreachable(error) or domain_active(domain):
            raise


def domain_active(domain: libvirt.virDomain) -> bool:
    try:
        return bool(domain.isActive())
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return False
        raise


def ignoring(action, code: int | None = None, *args) -> None:
    """Run ``action``; an error with ``code`` (any error if None) is what we wanted anyway."""
    try:
        action(*args)
    except libvirt.libvirtError as error:
        if code is not None and error.get_error_code() != code:
            raise


# libvirt domain state (and reason) -> the driver's VM state, with a message for people.
def vm_state(state: int, reason: int) -> tuple[str, str]:
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


def ip_address(domain: libvirt.virDomain) -> str | None:
    """The guest's address from the network's DHCP leases, else from a guest agent; None when
    neither knows yet (or the hypervisor cannot say)."""
    for source in (
        libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
        libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
    ):
        try:
            interfaces = domain.interfaceAddresses(source) or {}
        except libvirt.libvirtError as error:
            if unreachable(error):
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
        ignoring(stream.abort)
        raise


_UPLOAD_CHUNK = 256 * 1024


def storage_pool(connection: libvirt.virConnect, name: str) -> libvirt.virStoragePool | None:
    try:
        return connection.storagePoolLookupByName(name)
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_POOL:
            return None
        raise


def volume(pool: libvirt.virStoragePool, name: str) -> libvirt.virStorageVol | None:
    try:
        return pool.storageVolLookupByName(name)
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise
