"""A placed VM's address and MAC on its node's guest subnet (DESIGN.md section 10).

Part of the rentals services: ``guest_address_take`` runs inside ``vm_place``'s transaction,
beside the GPU allocations, and ``guest_address_release`` inside ``vm_transition`` when the VM
lets go of its GPUs. Nothing else writes ``GuestAddress`` rows.

A node without a guest subnet gives no address: its driver gives the guest one itself and
reports it once the VM runs (the simulated driver does). On a node with one, the subnet's first
address is the bridge's (the guests' gateway) and the guest gets the lowest address no live VM
holds. Two placements on one node at once both see the same lowest address; the partial unique
index lets one insert win, and the other, once the winner commits, gets the unique violation
and tries the next free address in the same transaction (a savepoint undoes only the failed
insert). The MAC is ``52:54:00`` (QEMU's locally administered prefix) followed by the address's
last three bytes, so an operator can read one from the other; two subnets that share those
bytes would clash, and then the VM gets a random locally administered MAC instead.
"""

import ipaddress
import secrets

from django.db import IntegrityError, transaction

from gpucap.drivers.base import GuestNetwork
from gpucap.errors import Conflict
from gpucap.fleet.models import Node
from gpucap.rentals.models import GuestAddress, VirtualMachine

# How many times a placement tries the next address after losing one to another placement.
_ATTEMPTS = 32
_ADDRESS_TAKEN = "guestaddress_one_live_holder_per_address"
_MAC_TAKEN = "guestaddress_one_live_holder_per_mac"


def guest_address_take(*, vm: VirtualMachine, node: Node) -> GuestAddress | None:
    """Give ``vm`` the lowest free address of ``node``'s guest subnet and a MAC (None when the
    node has no subnet). A full subnet is a Conflict naming the node and the subnet."""
    if not node.guest_subnet:
        return None
    subnet = ipaddress.ip_network(node.guest_subnet)
    held = {
        ipaddress.ip_address(address)
        for address in GuestAddress.objects.filter(node=node, released_at=None).values_list(
            "address", flat=True
        )
    }
    mac = None
    for _ in range(_ATTEMPTS):
        address = _lowest_free(subnet, held)
        if address is None:
            raise Conflict(
                f"the guest subnet {subnet} of node {node.hostname} has no free address "
                f"({len(held)} held by live VMs)",
                code="guest_subnet_full",
            )
        try:
            with transaction.atomic():
                return GuestAddress.objects.create(
                    vm=vm, node=node, address=str(address), mac=mac or mac_for(address)
                )
        except IntegrityError as exc:
            taken = _constraint(exc)
            if taken == _ADDRESS_TAKEN:
                held.add(address)  # another placement won it: the next one
            elif taken == _MAC_TAKEN:
                mac = _random_mac()
            else:
                raise
    raise Conflict(
        f"node {node.hostname}: other placements kept taking the free addresses of its guest "
        f"subnet {subnet}; try again",
        code="guest_subnet_busy",
    )


def guest_address_release(*, vm: VirtualMachine, at) -> None:
    """The VM let go of its GPUs: its address and MAC are free for the next VM."""
    GuestAddress.objects.filter(vm=vm, released_at=None).update(released_at=at)


def guest_network_for(vm: VirtualMachine) -> GuestNetwork | None:
    """What the driver wires the guest with: its live address (with the subnet's prefix), the
    gateway, its MAC and the node's bridge. None when gpucap gave it no address."""
    held = (
        GuestAddress.objects.filter(vm=vm, released_at=None)
        .select_related("node")
        .only("address", "mac", "node__guest_bridge", "node__guest_subnet")
        .first()
    )
    if held is None or not held.node.guest_subnet:
        return None
    subnet = ipaddress.ip_network(held.node.guest_subnet)
    return GuestNetwork(
        mac=held.mac,
        address=f"{held.address}/{subnet.prefixlen}",
        gateway=str(gateway_of(subnet)),
        bridge=held.node.guest_bridge,
    )


def gateway_of(subnet: ipaddress.IPv4Network) -> ipaddress.IPv4Address:
    """The subnet's first host address: the bridge's own on the node, never a guest's."""
    return subnet.network_address + 1


def mac_for(address: ipaddress.IPv4Address) -> str:
    """``52:54:00`` and the address's last three bytes: 10.200.0.18 -> 52:54:00:c8:00:12."""
    return "52:54:00:" + ":".join(f"{byte:02x}" for byte in address.packed[1:])


def _lowest_free(
    subnet: ipaddress.IPv4Network, held: set[ipaddress.IPv4Address]
) -> ipaddress.IPv4Address | None:
    # Guests: from the address after the gateway up to the one before the broadcast address.
    first = int(gateway_of(subnet)) + 1
    last = int(subnet.broadcast_address) - 1
    # At most one address per live VM on the node is held, so this loop is short.
    for number in range(first, last + 1):
        address = ipaddress.IPv4Address(number)
        if address not in held:
            return address
    return None


def _random_mac() -> str:
    # 0x52: locally administered, unicast.
    return "52:54:" + ":".join(f"{byte:02x}" for byte in secrets.token_bytes(4))


def _constraint(exc: IntegrityError) -> str:
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None) or ""
