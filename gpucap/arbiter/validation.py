"""Is a snapshot one the planner may plan? Every problem, one line each.

`snapshot_problems` checks a `Snapshot` built anywhere (the CLI's JSON reader or the Django side's
database snapshot) for references that lead nowhere, GPUs out of range or held twice, blocks that
break the topology of DESIGN.md section 2, duplicate names and ranks. Each line names the item
(``vms[3] (vm-7)``) and the field, so an operator can fix a file without guessing.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpucap.arbiter.model import (
    FABRICS,
    MAX_NODE_GPUS,
    MAX_PROTECT_SECONDS,
    NODE_STATES,
    POOL_KINDS,
    VM_STATES,
    Demand,
    Deployment,
    Node,
    Pool,
    Snapshot,
    Vm,
)
from gpucap.arbiter.tenancy import reservation_problems, tenancy_problems
from gpucap.arbiter.topology import (
    gpu_count_problem,
    gpu_mask,
    partition_table,
    snapshot_table_problems,
)

Labelled = list[tuple[str, object]]


def snapshot_problems(snapshot: Snapshot) -> list[str]:
    """Every problem that keeps ``snapshot`` from being planned; empty when it is sound."""
    return check_snapshot(
        snapshot,
        nodes=_labelled("nodes", snapshot.nodes, "name"),
        pools=_labelled("pools", snapshot.pools, "name"),
        deployments=_labelled("deployments", snapshot.deployments, "name"),
        vms=_labelled("vms", snapshot.vms, "id"),
        demands=_labelled("demands", snapshot.demands, "id"),
        quotas=_labelled("quotas", snapshot.quotas, "tenant"),
        reservations=_labelled("reservations", snapshot.reservations, "id"),
    )


def item_label(section: str, index: int, name: object) -> str:
    """``vms[3] (vm-7)``: where an item sits in the snapshot file, and what it is called."""
    if isinstance(name, str) and name:
        return f"{section}[{index}] ({name})"
    return f"{section}[{index}]"


def check_snapshot(
    snapshot: Snapshot,
    *,
    nodes: Labelled,
    pools: Labelled,
    deployments: Labelled,
    vms: Labelled,
    demands: Labelled,
    quotas: Labelled | None = None,
    reservations: Labelled | None = None,
    unreadable: dict[str, set[str]] | None = None,
) -> list[str]:
    """The checks behind `snapshot_problems`, on items that carry their own labels.

    ``unreadable`` names items (per section) that exist in the input but could not be read; a
    reference to one of them is not reported again as unknown.
    """
    unreadable = unreadable or {}
    problems: list[str] = []
    fabric = snapshot.capacity_set.fabric
    if fabric not in FABRICS:
        problems.append(f"set: fabric must be one of {_choices(FABRICS)}, got {fabric!r}")
        return problems
    node_by_name = _check_nodes(nodes, fabric, problems)
    pool_by_name = _check_pools(pools, problems)
    deployment_by_name = _check_deployments(
        deployments, pool_by_name, unreadable.get("pools", set()), problems
    )
    vm_ids = _check_vms(
        vms, fabric, node_by_name, pool_by_name, deployment_by_name, unreadable, problems
    )
    _check_demands(demands, fabric, pool_by_name, node_by_name, vm_ids, unreadable, problems)
    problems.extend(
        tenancy_problems(
            nodes=nodes,
            demands=demands,
            quotas=quotas or [],
            pool_names=set(pool_by_name),
            unreadable_pools=unreadable.get("pools", set()),
        )
    )
    if reservations:
        problems.extend(reservation_problems(reservations=reservations, nodes=nodes, fabric=fabric))
    return [one_line(problem) for problem in problems]


def one_line(problem: str) -> str:
    """A problem as exactly one line, even when a name in it holds a line break."""
    if problem.isprintable():
        return problem
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in problem)


def _labelled(section: str, items: Iterable[object], name_field: str) -> Labelled:
    return [
        (item_label(section, index, getattr(item, name_field)), item)
        for index, item in enumerate(items)
    ]


def _choices(values: Iterable[str]) -> str:
    return ", ".join(values)


def _check_nodes(nodes: Labelled, fabric: str, problems: list[str]) -> dict[str, Node]:
    by_name: dict[str, Node] = {}
    verdicts: dict[tuple, list[str]] = {}
    for label, node in nodes:
        assert isinstance(node, Node)
        if not node.name:
            problems.append(f"{label}: name must not be empty")
        elif node.name in by_name:
            problems.append(f"{label}: name {node.name} is used by another node")
        if not 1 <= node.gpus <= MAX_NODE_GPUS:
            problems.append(f"{label}: gpus must be 1..{MAX_NODE_GPUS}, got {node.gpus}")
            continue
        if node.state not in NODE_STATES:
            problems.append(
                f"{label}: state must be one of {_choices(NODE_STATES)}, got {node.state!r}"
            )
        out_of_range = [index for index in node.failed_gpus if not 0 <= index < node.gpus]
        if out_of_range:
            problems.append(
                f"{label}: failed_gpus {out_of_range} out of range for a node with {node.gpus} GPUs"
            )
        if len(set(node.failed_gpus)) != len(node.failed_gpus):
            problems.append(f"{label}: failed_gpus lists a GPU twice")
        if node.partitions is not None:
            if fabric == "pcie":
                problems.append(
                    f"{label}: partitions apply only to NVSwitch sets; a PCIe set allocates "
                    f"single cards"
                )
            else:
                _check_partition_table(label, node, problems, verdicts)
        by_name.setdefault(node.name, node)
    return by_name


def _check_partition_table(
    label: str, node: Node, problems: list[str], verdicts: dict[tuple, list[str]]
) -> None:
    # Most nodes of a set share a handful of tables: judge each distinct table once.
    key = (node.gpus, node.partitions)
    verdict = verdicts.get(key)
    if verdict is None:
        verdict = verdicts[key] = snapshot_table_problems(node.partitions, node.gpus)
    problems.extend(f"{label}: {problem}" for problem in verdict)


def _check_pools(pools: Labelled, problems: list[str]) -> dict[str, Pool]:
    by_name: dict[str, Pool] = {}
    by_rank: dict[int, Pool] = {}
    for label, pool in pools:
        assert isinstance(pool, Pool)
        if not pool.name:
            problems.append(f"{label}: name must not be empty")
        elif pool.name in by_name:
            problems.append(f"{label}: name {pool.name} is used by another pool")
        if pool.kind not in POOL_KINDS:
            problems.append(
                f"{label}: kind must be one of {_choices(POOL_KINDS)}, got {pool.kind!r}"
            )
        if pool.rank < 1:
            problems.append(f"{label}: rank must be 1 or more, got {pool.rank}")
        elif pool.rank in by_rank:
            problems.append(
                f"{label}: rank {pool.rank} is also the rank of pool {by_rank[pool.rank].name}; "
                f"ranks are unique within a set"
            )
        else:
            by_rank[pool.rank] = pool
        if pool.floor_gpus < 0:
            problems.append(f"{label}: floor_gpus must be 0 or more, got {pool.floor_gpus}")
        if not 0 <= pool.protect_seconds <= MAX_PROTECT_SECONDS:
            problems.append(
                f"{label}: protect_seconds must be 0..{MAX_PROTECT_SECONDS}, "
                f"got {pool.protect_seconds}"
            )
        by_name.setdefault(pool.name, pool)
    return by_name


def _check_deployments(
    deployments: Labelled,
    pool_by_name: dict[str, Pool],
    unreadable_pools: set[str],
    problems: list[str],
) -> dict[str, Deployment]:
    by_name: dict[str, Deployment] = {}
    for label, deployment in deployments:
        assert isinstance(deployment, Deployment)
        if not deployment.name:
            problems.append(f"{label}: name must not be empty")
        elif deployment.name in by_name:
            problems.append(f"{label}: name {deployment.name} is used by another deployment")
        pool = pool_by_name.get(deployment.pool)
        if pool is None:
            if deployment.pool not in unreadable_pools:
                problems.append(f"{label}: pool {deployment.pool} is not a pool of the snapshot")
        elif pool.kind != "inference":
            problems.append(
                f"{label}: pool {pool.name} is a {pool.kind} pool; deployments belong to "
                f"inference pools"
            )
        if deployment.min_replicas < 0:
            problems.append(
                f"{label}: min_replicas must be 0 or more, got {deployment.min_replicas}"
            )
        by_name.setdefault(deployment.name, deployment)
    return by_name


def _check_vms(
    vms: Labelled,
    fabric: str,
    node_by_name: dict[str, Node],
    pool_by_name: dict[str, Pool],
    deployment_by_name: dict[str, Deployment],
    unreadable: dict[str, set[str]],
    problems: list[str],
) -> set[str]:
    ids: set[str] = set()
    held: dict[str, list[tuple[int, str]]] = {}  # node name -> (GPUs as a mask, VM id), ...
    table_masks: dict[int, frozenset[int]] = {}
    tables: dict[str, int] = {}  # node name -> id of its partition table
    # (table id, node GPUs, VM GPUs) -> (problem or None, mask), as `_vm_gpus_problem` says:
    # fleets repeat a few shapes many times.
    shapes: dict[tuple, tuple[str | None, int]] = {}
    unreadable_pools = unreadable.get("pools", ())
    for label, vm in vms:
        assert isinstance(vm, Vm)
        vm_id = vm.id
        if not vm_id:
            problems.append(f"{label}: id must not be empty")
        elif vm_id in ids:
            problems.append(f"{label}: id {vm_id} is used by another VM")
        ids.add(vm_id)
        if vm.pool not in pool_by_name and vm.pool not in unreadable_pools:
            problems.append(f"{label}: pool {vm.pool} is not a pool of the snapshot")
        if vm.state not in VM_STATES:
            problems.append(
                f"{label}: state must be one of {_choices(VM_STATES)}, got {vm.state!r}"
            )
        if vm.group is not None and (type(vm.group) is not str or not vm.group.strip()):
            problems.append(f"{label}: group must be a non-empty job name, got {vm.group!r}")
        if vm.deployment is not None:
            deployment = deployment_by_name.get(vm.deployment)
            if deployment is None:
                if vm.deployment not in unreadable.get("deployments", ()):
                    problems.append(
                        f"{label}: deployment {vm.deployment} is not a deployment of the snapshot"
                    )
            elif deployment.pool != vm.pool:
                problems.append(
                    f"{label}: deployment {vm.deployment} belongs to pool {deployment.pool}, "
                    f"not {vm.pool}"
                )
        node = node_by_name.get(vm.node)
        if node is None:
            if vm.node not in unreadable.get("nodes", ()):
                problems.append(f"{label}: node {vm.node} is not a node of the snapshot")
            continue
        gpus = vm.gpus
        table = tables.get(node.name)
        if table is None:
            table = tables[node.name] = id(partition_table(node, fabric))
        shape = (table, node.gpus, gpus)
        checked = shapes.get(shape)
        if checked is None:
            checked = shapes[shape] = _vm_gpus_problem(vm, node, fabric, table_masks)
        problem, mask = checked
        if problem:
            problems.append(f"{label}: {problem.format(node=node.name)}")
            if not mask:
                continue
        node_held = held.get(node.name)
        if node_held is None:
            held[node.name] = [(mask, vm_id)]
            continue
        for other_mask, other in node_held:
            if other_mask & mask:
                for index in gpus:
                    if other_mask >> index & 1:
                        problems.append(
                            f"{label}: gpu {index} of node {node.name} is already held by VM "
                            f"{other}"
                        )
                mask &= ~other_mask
        node_held.append((mask, vm_id))
    return ids


def _vm_gpus_problem(
    vm: Vm, node: Node, fabric: str, table_masks: dict[int, frozenset[int]]
) -> tuple[str | None, int]:
    """What is wrong with ``vm``'s GPUs on ``node``, with ``{node}`` for the node's name (the
    same GPUs on another node with the same table have the same problem), and the GPUs the VM
    holds as a mask: 0 when they are not GPUs of the node at all."""
    gpus = vm.gpus
    if not gpus:
        return "gpus must list at least one GPU", 0
    if min(gpus) < 0 or max(gpus) >= node.gpus:
        out_of_range = [index for index in gpus if not 0 <= index < node.gpus]
        return f"gpus {out_of_range} out of range for node {{node}} with {node.gpus} GPUs", 0
    if len(set(gpus)) != len(gpus):
        return f"gpus {list(gpus)} lists a GPU twice", 0
    return _vm_topology_problem(vm, node, fabric, table_masks), gpu_mask(gpus)


def _vm_topology_problem(
    vm: Vm, node: Node, fabric: str, table_masks: dict[int, frozenset[int]]
) -> str | None:
    """The topology problem of ``vm``'s GPUs on ``node`` with ``{node}`` for the node's name
    (the same shape on another node with the same table has the same problem), or None."""
    if fabric == "pcie":
        if len(vm.gpus) != 1:
            return (
                f"gpus {list(vm.gpus)}: a VM in a PCIe set holds exactly 1 GPU, not {len(vm.gpus)}"
            )
        return None
    table = partition_table(node, fabric)
    # Keyed by identity: default tables are shared objects, and hashing a whole table per VM
    # would cost more than the check. The nodes keep every table alive meanwhile.
    masks = table_masks.get(id(table))
    if masks is None:
        masks = table_masks[id(table)] = frozenset(
            gpu_mask(block)
            for block in table
            if all(0 <= index < node.gpus for index in block)  # bad ones are reported already
        )
    if gpu_mask(vm.gpus) not in masks:
        return f"gpus {list(vm.gpus)} are not a partition of node {{node}}'s table"
    return None


def _check_demands(
    demands: Labelled,
    fabric: str,
    pool_by_name: dict[str, Pool],
    node_by_name: dict,
    vm_ids: set[str],
    unreadable: dict[str, set[str]],
    problems: list[str],
) -> None:
    ids: set[str] = set()
    for label, demand in demands:
        assert isinstance(demand, Demand)
        if not demand.id:
            problems.append(f"{label}: id must not be empty")
        elif demand.id in ids:
            problems.append(f"{label}: id {demand.id} is used by another demand")
        elif demand.id in vm_ids:
            problems.append(f"{label}: id {demand.id} is also the id of a VM of the snapshot")
        ids.add(demand.id)
        if not demand.group:
            problems.append(f"{label}: group must not be empty")
        if demand.pool not in pool_by_name and demand.pool not in unreadable.get("pools", ()):
            problems.append(f"{label}: pool {demand.pool} is not a pool of the snapshot")
        size_problem = gpu_count_problem(fabric, demand.gpus)
        if size_problem:
            problems.append(f"{label}: gpus: {size_problem}")
        if (
            demand.disk_node is not None
            and demand.disk_node not in node_by_name
            and demand.disk_node not in unreadable.get("nodes", ())
        ):
            problems.append(f"{label}: disk_node {demand.disk_node} is not a node of the snapshot")
