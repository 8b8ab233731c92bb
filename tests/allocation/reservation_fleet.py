"""The fleet the reservation tests share: h100-east (two 8-GPU NVSwitch nodes) filled by
globex's four running 4-GPU spot VMs, ``batch-1`` .. ``batch-4``, while acme may rent spot and
on-demand there."""

from gpucap.fleet import services as fleet
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import running_vm

BATCH = [f"batch-{n}" for n in range(1, 5)]
HALVES = [
    (node, half) for node in ("h100-001", "h100-002") for half in ((0, 1, 2, 3), (4, 5, 6, 7))
]


def globex_spots_fill(fleet_east: dict, tenant, other_tenant, *, ips: str) -> list[VirtualMachine]:
    """globex's spot VMs on every GPU of h100-east; ``ips``: the first three octets of their
    addresses (distinct per test module, as the guests' addresses are unique)."""
    pools, nodes = fleet_east["pools"], fleet_east["nodes"]
    fleet.pool_set_tenants(pool=pools["h100-spot"], tenants=[tenant, other_tenant])
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[tenant])
    return [
        running_vm(
            other_tenant,
            pools["h100-spot"],
            nodes[node],
            list(half),
            name=name,
            ip=f"{ips}.{n}",
        )
        for n, (name, (node, half)) in enumerate(zip(BATCH, HALVES, strict=True), start=1)
    ]
