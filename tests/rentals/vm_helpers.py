"""Helpers for the VM page and API tests: pools granted to the test tenants, VMs driven through
the lifecycle service into each state, and a snapshot of everything a refused request must
leave unchanged."""

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.rentals import services
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.usage.models import UsageInterval

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq0p3b1WkYc8u8Ww mallory@laptop"
IMAGE = "ubuntu-24.04-cuda-12.6"


def grant_pools(fleet_east, tenant, other_tenant) -> dict:
    """acme may use h100-spot (NVSwitch set), a100-standalone (NVSwitch, standalone) and
    l40s-ondemand (PCIe set); globex only l40s-ondemand. Nobody may use h100-ondemand."""
    pools = fleet_east["pools"]
    fleet.pool_set_tenants(pool=pools["a100-standalone"], tenants=[tenant])
    fleet.pool_set_tenants(pool=pools["l40s-ondemand"], tenants=[tenant, other_tenant])
    return pools


def request_vm(tenant, pool, *, name: str, gpu_count: int = 1, actor=None) -> VirtualMachine:
    return services.vm_request(
        tenant=tenant,
        pool=pool,
        name=name,
        gpu_count=gpu_count,
        image=IMAGE,
        ssh_public_key=SSH_KEY,
        actor=actor,
    )


def running_vm(tenant, pool, node, gpus: list[int], *, name: str, ip: str) -> VirtualMachine:
    vm = request_vm(tenant, pool, name=name, gpu_count=len(gpus))
    services.vm_place(vm=vm, node=node, gpu_indices=gpus)
    return services.vm_mark_running(vm=vm, ip_address=ip)


def stopped_vm(tenant, pool, node, gpus: list[int], *, name: str) -> VirtualMachine:
    vm = running_vm(tenant, pool, node, gpus, name=name, ip="10.9.9.9")
    services.vm_stop(vm=vm)
    return services.vm_mark_stopped(vm=vm)


def world() -> dict:
    """Everything a refused request must not change."""
    return {
        "vms": list(
            VirtualMachine.objects.order_by("pk").values_list(
                "pk", "tenant_id", "pool_id", "name", "state", "node_id", "stop_reason"
            )
        ),
        "allocations": list(
            Allocation.objects.order_by("pk").values_list("pk", "vm_id", "gpu_id", "released_at")
        ),
        "usage": list(UsageInterval.objects.order_by("pk").values_list("pk", "ended_at")),
        "events": AuditEvent.objects.count(),
    }
