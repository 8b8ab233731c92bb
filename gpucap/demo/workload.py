"""The demo's tenants at work, so `make run` opens on a capacity set with something to decide:
h100-east is nearly full of spot VMs and two on-demand VMs, and three requests wait: two
on-demand VMs of 8 GPUs and a spot VM of 4. One on-demand VM fits on the free node; the other
needs a reclaim, which the set (in dry-run) only previews until an operator approves it. The spot
request stays unsatisfied (spot may reclaim nothing, and no whole 4-GPU partition is free), so
the first plan is "incomplete".

Everything goes through the lifecycle services, like an operator placing VMs by hand: the VMs
are provisioned by the worker `make run` starts (the simulated driver boots them). Loaded once:
a database that has any VM already is left alone.
"""

from django.contrib.auth import get_user_model
from django.db import transaction

from gpucap.fleet.models import Node, Pool
from gpucap.rentals import services
from gpucap.rentals.models import VirtualMachine
from gpucap.tenancy.models import Tenant

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDemoDemoDemoDemoDemoDemoDemoDemoDemo demo@gpucap"
IMAGE = "ubuntu-24.04-cuda-12.6"

# (tenant, pool, name, node, GPUs) placed in this order (so later ones started later).
RUNNING = [
    ("globex", "h100-ondemand", "llm-pretrain-a", "h100-001", [0, 1, 2, 3, 4, 5, 6, 7]),
    ("acme", "h100-ondemand", "rl-sim", "h100-002", [0, 1, 2, 3, 4, 5, 6, 7]),
    *(
        (tenant, "h100-spot", f"{tenant}-spot-{node[-2:]}{half}", node, gpus)
        for node in ("h100-003", "h100-004", "h100-005", "h100-006", "h100-007", "h100-009")
        for half, tenant, gpus in (
            ("a", "acme", [0, 1, 2, 3]),
            ("b", "globex", [4, 5, 6, 7]),
        )
    ),
    ("acme", "h100-spot", "acme-spot-10a", "h100-010", [0, 1, 2, 3]),
    ("acme", "h100-spot", "acme-spot-10b", "h100-010", [4, 5]),
    ("globex", "h100-spot", "globex-spot-10c", "h100-010", [6, 7]),
    ("globex", "h100-spot", "globex-spot-11a", "h100-011", [0, 1, 2, 3]),
    ("globex", "h100-spot", "globex-spot-11b", "h100-011", [4, 5, 6, 7]),
    ("acme", "h100-spot", "acme-spot-12", "h100-012", [0, 1, 2, 3]),
    *(
        (tenant, "h100-spot", f"{tenant}-spot-{node[-2:]}{pair}", node, gpus)
        for node in ("h100-013", "h100-014", "h100-015")
        for pair, tenant, gpus in (
            ("a", "acme", [0, 2]),
            ("b", "globex", [1, 3]),
            ("c", "acme", [4, 5, 6, 7]),
        )
    ),
]
# (tenant, pool, name, GPUs) left pending for the arbiter.
PENDING = [
    ("globex", "h100-ondemand", "llm-pretrain-b", 8),
    ("acme", "h100-ondemand", "eval-sweep", 8),
    ("globex", "h100-spot", "globex-batch", 4),
]


@transaction.atomic
def demo_workload() -> str:
    """Place the demo's VMs and requests (once). Returns one line saying what it did."""
    if VirtualMachine.objects.exists():
        return "demo workload: VMs exist already, left as they are"
    tenants = {tenant.slug: tenant for tenant in Tenant.objects.filter(slug__in=["acme", "globex"])}
    pools = {
        pool.name: pool for pool in Pool.objects.filter(name__in=["h100-ondemand", "h100-spot"])
    }
    nodes = {node.hostname: node for node in Node.objects.filter(hostname__startswith="h100-")}
    operator = get_user_model().objects.filter(username="ops").first()
    for tenant, pool, name, node, gpus in RUNNING:
        vm = _request(tenants[tenant], pools[pool], name, len(gpus))
        services.vm_place(
            vm=vm,
            node=nodes[node],
            gpu_indices=gpus,
            actor=operator,
            message="demo workload",
        )
    for tenant, pool, name, gpu_count in PENDING:
        _request(tenants[tenant], pools[pool], name, gpu_count)
    return (
        f"demo workload: {len(RUNNING)} VMs placed in h100-east (the worker boots them), "
        f"{len(PENDING)} requests waiting for the arbiter's plan"
    )


def _request(tenant: Tenant, pool: Pool, name: str, gpu_count: int) -> VirtualMachine:
    return services.vm_request(
        tenant=tenant,
        pool=pool,
        name=name,
        gpu_count=gpu_count,
        image=IMAGE,
        ssh_public_key=SSH_KEY,
    )
