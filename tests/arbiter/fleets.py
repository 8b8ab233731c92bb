"""Small capacity sets for arbiter tests: hand-written builders and hypothesis strategies."""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime, timedelta

from hypothesis import strategies as st

from gpucap.arbiter.model import (
    CapacitySet,
    Demand,
    Deployment,
    Node,
    Pool,
    Quota,
    Reservation,
    Snapshot,
    Vm,
)
from gpucap.arbiter.topology import block_sizes, partition_table

T0 = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)

HGX_PAIRS = (
    (0, 1, 2, 3, 4, 5, 6, 7),
    (0, 1, 2, 3),
    (4, 5, 6, 7),
    (0, 2),
    (1, 3),
    (4, 6),
    (5, 7),
    *((index,) for index in range(8)),
)
# A table that is not nested: the 4-GPU partitions cut across the pairs, and two GPUs have no
# partition of their own.
CROSSED = (
    (0, 1, 2, 3, 4, 5, 6, 7),
    (0, 1, 4, 5),
    (2, 3, 6, 7),
    (0, 1),
    (2, 3),
    (4, 5),
    (6, 7),
    (0,),
    (1,),
    (2,),
    (3,),
    (4,),
    (5,),
)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def snapshot(
    *,
    fabric: str = "nvswitch",
    nodes: list[Node] | None = None,
    pools: list[Pool] | None = None,
    vms: list[Vm] | None = None,
    demands: list[Demand] | None = None,
    deployments: list[Deployment] | None = None,
    quotas: list[Quota] | None = None,
    reservations: list[Reservation] | None = None,
) -> Snapshot:
    return Snapshot(
        capacity_set=CapacitySet(name="test-set", fabric=fabric, gpu_model="H100"),
        nodes=tuple(nodes if nodes is not None else [Node("n001", 8)]),
        pools=tuple(pools if pools is not None else standard_pools()),
        vms=tuple(vms or ()),
        demands=tuple(demands or ()),
        deployments=tuple(deployments or ()),
        now=at(600),
        quotas=tuple(quotas or ()),
        reservations=tuple(reservations or ()),
    )


def standard_pools(*, spot_floor: int = 0, chat_floor: int = 0) -> list[Pool]:
    return [
        Pool("chat", "inference", 1, chat_floor),
        Pool("rent", "on_demand", 2, 0),
        Pool("spot", "spot", 3, spot_floor),
    ]


def vm(vm_id: str, pool: str, node: str, gpus: tuple[int, ...], minute: int = 0, **extra) -> Vm:
    return Vm(id=vm_id, pool=pool, node=node, gpus=tuple(gpus), started_at=at(minute), **extra)


def demand(
    demand_id: str,
    pool: str,
    gpus: int,
    *,
    group: str | None = None,
    minute: int = 300,
    tenant: str | None = None,
):
    return Demand(
        id=demand_id,
        group=group or demand_id,
        pool=pool,
        gpus=gpus,
        requested_at=at(minute),
        tenant=tenant,
    )


POOL_KINDS = ("on_demand", "spot", "inference")
# Tenants of random sets with tenancy: VMs, demand groups, dedicated nodes and quotas.
TENANTS = ("acme", "globex")
QUOTA_SIZES = (0, 1, 2, 4, 6, 8, 8, 12, 16, 24)
# A pool's protect_seconds in random sets. VMs start at minutes 0-240 and sets plan at minute
# 600, so these protect none, about a quarter, about 60 % or nearly all of a pool's VMs.
PROTECT_CHOICES = (0, 0, 0, 420 * 60, 500 * 60, 600 * 60)


@st.composite
def snapshots(
    draw,
    *,
    fabric: str | None = None,
    max_nodes: int = 6,
    min_demands: int = 0,
    max_demands: int = 6,
    max_groups: int = 4,
    victim_kinds: tuple[str, ...] | None = None,
    crowded: bool = False,
    max_jobs: int = 0,
    tenancy: bool = False,
    reservations: bool = False,
) -> Snapshot:
    """A random, valid capacity set: nodes of both fabrics with default, HGX and crossed
    tables, failed GPUs and cordoned nodes; 2-4 ranked pools with floors; inference deployments
    with min_replicas; running and notified VMs, some of them in up to ``max_jobs`` running
    multi-VM jobs (2-4 VMs sharing a group, on one node or several, any pools; none by default,
    for references that do not model jobs); demands alone
    or in up to ``max_groups`` shared groups. ``max_groups=0`` makes every demand a group of
    one. ``crowded`` fills the nodes up, so that most demands need a reclaim. ``tenancy`` gives
    demand groups tenants, dedicates some nodes to tenants and adds up to three quotas (off by
    default, for references that do not model tenants). ``reservations`` (with ``tenancy``) adds
    up to two reservations, mostly within the set's ready shared GPUs, and flags some VMs as
    borrowing from them (or from a reservation that ended)."""
    fabric = fabric or draw(st.sampled_from(("nvswitch", "pcie")))
    pool_count = draw(st.integers(2, 4))
    kind_choices = victim_kinds or ("spot", "spot", "inference", "on_demand")
    # Rank 1 may be anything; lower ranks lean to the kinds that can lose GPUs.
    kinds = [draw(st.sampled_from(POOL_KINDS))]
    kinds += [draw(st.sampled_from(kind_choices)) for _ in range(pool_count - 1)]
    ranks = list(range(1, pool_count + 1))
    names = [f"p{rank}" for rank in ranks]
    pools = [
        Pool(
            name,
            kind,
            rank,
            draw(st.sampled_from((0, 0, 0, 0, 1, 2, 4, 8))),
            draw(st.sampled_from(PROTECT_CHOICES)),
        )
        for name, kind, rank in zip(names, kinds, ranks, strict=True)
    ]
    deployments = [
        Deployment(f"{pool.name}-model", pool.name, draw(st.integers(0, 2)))
        for pool in pools
        if pool.kind == "inference"
    ]
    node_count = draw(st.integers(1, max_nodes))
    nodes = []
    for index in range(node_count):
        if fabric == "pcie":
            gpus = draw(st.integers(1, 8))
            partitions = None
        else:
            gpus = draw(st.sampled_from((8, 8, 8, 8, 4, 2)))
            partitions = None
            if gpus == 8:
                partitions = draw(st.sampled_from((None, None, HGX_PAIRS, CROSSED)))
        state = draw(st.sampled_from(("ready",) * 10 + ("cordoned", "down")))
        failed = tuple(draw(st.sets(st.integers(0, gpus - 1), max_size=1)))
        tenant = draw(st.sampled_from((None, None, None, *TENANTS))) if tenancy else None
        nodes.append(Node(f"n{index + 1:03d}", gpus, state, failed, partitions, tenant))
    vms = []
    for node in nodes:
        table = partition_table(node, fabric)
        used = 0
        for _ in range(24 if crowded else draw(st.integers(0, 10))):
            block = draw(st.sampled_from(table))
            mask = sum(1 << index for index in block)
            if mask & used:
                continue
            used |= mask
            pool = draw(st.sampled_from(pools))
            deployment = None
            if pool.kind == "inference" and draw(st.booleans()):
                deployment = f"{pool.name}-model"
            vms.append(
                Vm(
                    id=f"vm-{len(vms) + 1}",
                    pool=pool.name,
                    node=node.name,
                    gpus=block,
                    started_at=at(draw(st.integers(0, 240))),
                    deployment=deployment,
                    state=draw(st.sampled_from(("running",) * 7 + ("notified",))),
                    tenant=_vm_tenant(draw, node),
                )
            )
    vms = _with_jobs(draw, vms, max_jobs)
    sizes = (1,) if fabric == "pcie" else (1, 1, 2, 2, 4, 4, 8)
    demand_count = draw(st.integers(min_demands, max_demands))
    demands = []
    group_tenants: dict[str, str | None] = {}
    for index in range(demand_count):
        # About half the demands are groups of one; the rest share up to max_groups groups.
        shared = draw(st.integers(0, max_groups))
        group = f"g{shared}" if shared else f"d{index + 1}"
        if group not in group_tenants:
            group_tenants[group] = draw(st.sampled_from((None, *TENANTS))) if tenancy else None
        demands.append(
            Demand(
                id=f"d{index + 1}",
                group=group,
                pool=draw(st.sampled_from(pools[:-1])).name,
                gpus=draw(st.sampled_from(sizes)),
                requested_at=at(300 + draw(st.integers(0, 30))),
                tenant=group_tenants[group],
            )
        )
    quotas = []
    if tenancy:
        scopes = draw(
            st.lists(
                st.tuples(st.sampled_from(TENANTS), st.sampled_from((None, *names))),
                max_size=3,
                unique=True,
            )
        )
        quotas = [
            Quota(tenant, pool, draw(st.sampled_from(QUOTA_SIZES))) for tenant, pool in scopes
        ]
    held_back: list[Reservation] = []
    if reservations:
        held_back = _reservations(draw, fabric, nodes)
        vms = _borrowers(draw, vms, held_back)
    return Snapshot(
        capacity_set=CapacitySet(name="random", fabric=fabric, gpu_model="H100"),
        nodes=tuple(nodes),
        pools=tuple(pools),
        vms=tuple(vms),
        demands=tuple(demands),
        deployments=tuple(deployments),
        now=at(600),
        quotas=tuple(quotas),
        reservations=tuple(held_back),
    )


def _reservations(draw, fabric: str, nodes: list[Node]) -> list[Reservation]:
    """Up to two reservations of tenants of the set: mostly together within its ready shared
    GPUs, sometimes past them (as when a node goes down), so that some are short."""
    room = sum(node.gpus for node in nodes if node.state == "ready" and node.tenant is None)
    past = draw(st.sampled_from((False, False, True)))
    found = []
    for tenant in draw(st.lists(st.sampled_from(TENANTS), unique=True, min_size=1, max_size=2)):
        block = draw(st.sampled_from(block_sizes(fabric)))
        gpus = block * draw(st.integers(1, 3))
        if gpus > room and not past:
            gpus = block
        if gpus <= room or past:
            room -= gpus
            found.append(Reservation(f"r-{tenant}", tenant, gpus, block))
    return found


def _borrowers(draw, vms: list[Vm], reservations: list[Reservation]) -> list[Vm]:
    """Flag some VMs as borrowing: from a reservation in force, or from one that ended."""
    ids = [r.id for r in reservations] + ["r-ended"]
    return [
        dataclasses.replace(vm, borrowed=draw(st.sampled_from((None, *ids, *ids)))) for vm in vms
    ]


def _vm_tenant(draw, node: Node) -> str | None:
    """Any tenant; on a dedicated node mostly the node's (the rest are moving off it)."""
    if node.tenant is not None and draw(st.sampled_from((True, True, True, False))):
        return node.tenant
    return draw(st.sampled_from((None, *TENANTS)))


def _with_jobs(draw, vms: list[Vm], max_jobs: int) -> list[Vm]:
    """Group some VMs into running jobs: mostly of one pool (as a tenant's job is), sometimes
    mixed, so that a member of another pool or under notice is part of the job."""
    free = list(range(len(vms)))
    for job in range(draw(st.integers(0, max_jobs))):
        if len(free) < 2:
            break
        members = draw(st.lists(st.sampled_from(free), min_size=2, max_size=4, unique=True))
        same_pool = draw(st.booleans())
        for position in members:
            free.remove(position)
            # A job is one tenant's, as a live VM group is (a resumed job's demands share it).
            extra = {"group": f"acme/job-{job + 1}", "tenant": vms[members[0]].tenant}
            if same_pool:
                extra["pool"] = vms[members[0]].pool
                extra["deployment"] = vms[members[0]].deployment
            vms[position] = dataclasses.replace(vms[position], **extra)
    return vms


def reclaim_scenario(rng: random.Random, *, max_nodes: int = 6, max_demands: int = 4) -> Snapshot:
    """A busy set where only one pool can lose GPUs (spot, rank 3), so a plan's disruption is one
    number: its preempted GPUs. Demands come from chat (rank 1) and rent (rank 2) in 1-3 groups;
    chat and rent VMs can never be victims of them."""
    fabric = rng.choice(("nvswitch", "nvswitch", "pcie"))
    pools = [
        Pool("chat", "inference", 1, 0),
        Pool("rent", "on_demand", 2, 0),
        Pool("spot", "spot", 3, rng.choice((0, 0, 2, 4))),
    ]
    deployments = [Deployment("chat-model", "chat", rng.choice((0, 1)))]
    nodes = []
    for index in range(rng.randint(2, max_nodes)):
        if fabric == "pcie":
            node = Node(f"n{index + 1:03d}", rng.randint(1, 8))
        else:
            gpus = rng.choice((8, 8, 8, 4))
            partitions = rng.choice((None, HGX_PAIRS, CROSSED)) if gpus == 8 else None
            node = Node(f"n{index + 1:03d}", gpus, partitions=partitions)
        nodes.append(node)
    vms = []
    for node in nodes:
        table = partition_table(node, fabric)
        used: set[int] = set()
        for _ in range(10):
            block = rng.choice(table)
            if used & set(block):
                continue
            used |= set(block)
            pool = rng.choices(("spot", "rent", "chat"), (6, 2, 2))[0]
            vms.append(
                Vm(
                    id=f"vm-{len(vms) + 1}",
                    pool=pool,
                    node=node.name,
                    gpus=block,
                    started_at=at(rng.randint(0, 240)),
                    deployment="chat-model" if pool == "chat" and rng.random() < 0.5 else None,
                )
            )
    sizes = (1,) if fabric == "pcie" else (1, 2, 2, 4, 4, 8)
    groups = rng.randint(1, 3)
    demands = []
    for index in range(rng.randint(groups, max(groups, max_demands))):
        demands.append(
            Demand(
                id=f"d{index + 1}",
                group=f"g{index % groups + 1}",
                pool=rng.choice(("chat", "rent")),
                gpus=rng.choice(sizes),
                requested_at=at(300 + rng.randint(0, 30)),
            )
        )
    return Snapshot(
        capacity_set=CapacitySet(name="reclaim", fabric=fabric, gpu_model="H100"),
        nodes=tuple(nodes),
        pools=tuple(pools),
        vms=tuple(vms),
        demands=tuple(demands),
        deployments=tuple(deployments),
        now=at(600),
    )
