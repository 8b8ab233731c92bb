"""Random contested capacity sets of up to 64 nodes, for comparing plans with the exact optimum.

`contested_set(rng, fabric)` makes a busy set where most groups need reclaims: nodes with their
own partition tables (default, HGX non-adjacent pairs, crossed), a few cordoned or down nodes
and failed GPUs, four or five ranked pools (one on-demand, inference with deployments and
min_replicas, spot tiers) with floors, running and notified VMs filling most GPUs (PCIe nodes
as full as NVSwitch ones), and pending gang groups of 1-4 demands (1-6 single cards on PCIe)
from several pools that ask for 1.2 to 3 times the free GPUs, so most sets of both fabrics need
reclaims. Seeded: the same ``rng`` state, the same set.
"""

from __future__ import annotations

import random

from gpucap.arbiter.model import CapacitySet, Demand, Deployment, Node, Pool, Snapshot, Vm
from gpucap.arbiter.topology import partition_table
from tests.arbiter.fleets import CROSSED, HGX_PAIRS, at

MAX_NODES = 64


def contested_set(rng: random.Random, fabric: str) -> Snapshot:
    node_count = rng.choice((rng.randint(2, 8), rng.randint(4, 24), rng.randint(8, MAX_NODES)))
    pools = _pools(rng)
    deployments = [
        Deployment(f"{pool.name}-model", pool.name, rng.choice((0, 1, 2, 4)))
        for pool in pools
        if pool.kind == "inference"
    ]
    nodes = [_node(rng, fabric, index) for index in range(node_count)]
    fill = rng.choice((0.8, 0.9, 1.0) if fabric == "pcie" else (0.7, 0.85, 0.95, 1.0))
    vms: list[Vm] = []
    free = 0  # GPUs of ready nodes that no VM holds and that have not failed
    for node in nodes:
        table = partition_table(node, fabric)
        used: set[int] = set()
        # A PCIe node's table is its single cards: try each about four times, so it fills
        # about as full as an NVSwitch node.
        for _ in range(12 if fabric == "nvswitch" else 4 * node.gpus):
            block = rng.choice(table)
            if used & set(block) or rng.random() > fill:
                continue
            used |= set(block)
            pool = rng.choices(pools, [1, 1, 2, 3, 3][: len(pools)])[0]
            deployment = None
            if pool.kind == "inference" and rng.random() < 0.6:
                deployment = f"{pool.name}-model"
            vms.append(
                Vm(
                    id=f"vm-{len(vms) + 1}",
                    pool=pool.name,
                    node=node.name,
                    gpus=block,
                    started_at=at(rng.randint(0, 480)),
                    deployment=deployment,
                    state="notified" if rng.random() < 0.05 else "running",
                    tenant=None,
                )
            )
        if node.state == "ready":
            free += node.gpus - len(used | set(node.failed_gpus))
    demands = _demands(rng, fabric, pools, node_count, free)
    return Snapshot(
        capacity_set=CapacitySet(name="contested", fabric=fabric, gpu_model="H100"),
        nodes=tuple(nodes),
        pools=tuple(pools),
        vms=tuple(vms),
        demands=tuple(demands),
        deployments=tuple(deployments),
        now=at(600),
    )


def _pools(rng: random.Random) -> list[Pool]:
    kinds = ["inference", "on_demand", rng.choice(("spot", "inference")), "spot"]
    if rng.random() < 0.5:
        kinds.append("spot")
    rng.shuffle(kinds)
    pools = []
    for rank, kind in enumerate(kinds, start=1):
        floor = rng.choice((0, 0, 0, 2, 4, 8, 16))
        pools.append(Pool(f"p{rank}", kind, rank, floor))
    return pools


def _node(rng: random.Random, fabric: str, index: int) -> Node:
    name = f"n{index + 1:03d}"
    state = rng.choices(("ready", "cordoned", "down"), (30, 1, 1))[0]
    if fabric == "pcie":
        gpus = rng.choice((8, 8, 4, 2))
        partitions = None
    else:
        gpus = rng.choice((8, 8, 8, 8, 4))
        partitions = rng.choice((None, HGX_PAIRS, HGX_PAIRS, CROSSED)) if gpus == 8 else None
    failed = (rng.randrange(gpus),) if rng.random() < 0.08 else ()
    return Node(name, gpus, state, failed, partitions)


def _demands(
    rng: random.Random, fabric: str, pools: list[Pool], node_count: int, free: int
) -> list:
    """Gang groups from every pool but the lowest, asking in all for more GPUs than are free
    (1.2 to 3 times, at least 2 GPUs more), so most sets need reclaims; at most a quarter as
    many groups as nodes (at least 2)."""
    sizes = (1,) if fabric == "pcie" else (1, 1, 2, 2, 4, 8)
    demands = []
    wanted = max(free + 2, round(free * rng.choice((1.2, 1.5, 2.0, 3.0))))
    groups = max(2, node_count // 4)
    for group in range(groups):
        if sum(demand.gpus for demand in demands) >= wanted:
            break
        # Groups come from every pool but the lowest, the higher ones more often.
        pool = rng.choices(pools[:-1], [4, 3, 2, 1][: len(pools) - 1])[0]
        members = rng.choice((1, 1, 2, 3, 4) if fabric == "nvswitch" else (1, 2, 3, 4, 6))
        for _ in range(members):
            member_pool = pool if rng.random() < 0.8 else rng.choice(pools[:-1])
            demands.append(
                Demand(
                    id=f"d{len(demands) + 1}",
                    group=f"g{group + 1}",
                    pool=member_pool.name,
                    gpus=rng.choice(sizes),
                    requested_at=at(500 + rng.randint(0, 60)),
                )
            )
    return demands
