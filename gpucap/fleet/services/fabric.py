"""Fabric Manager's names for a node's NVLink fabric: each GPU's module id, and the partition
table as Fabric Manager lists it (``manage.py fabric_partitions_import``).

Fabric Manager names GPUs by module (physical) id, 1..8 on an HGX baseboard, which is not the
host's GPU index. The table is stored in GPU indices (``Node.partitions``, what the arbiter
reads) with Fabric Manager's id for each partition beside it (``Node.fabric_partition_ids``,
what the driver activates)."""

from collections.abc import Mapping, Sequence

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from gpucap.audit.services import Actor, audit_record
from gpucap.fleet import rules
from gpucap.fleet.models import MAX_GPUS_PER_NODE, Gpu, Node
from gpucap.fleet.services._common import capacity_set_bump


def module_id_problem(module_id: object) -> str:
    """Why ``module_id`` is not a GPU's module id (None clears it), or ""."""
    if module_id is None:
        return ""
    if not isinstance(module_id, int) or isinstance(module_id, bool):
        return f"must be a whole number 1..{MAX_GPUS_PER_NODE} or null, got {module_id!r}"
    if not 1 <= module_id <= MAX_GPUS_PER_NODE:
        return (
            f"must be 1..{MAX_GPUS_PER_NODE} (Fabric Manager counts modules from 1), "
            f"got {module_id}"
        )
    return ""


def module_ids_problem(module_ids: Mapping[int, int | None]) -> str:
    """Why GPUs (index -> module id) cannot carry these module ids together, or ""."""
    holders: dict[int, list[int]] = {}
    for index, module_id in sorted(module_ids.items()):
        if module_id is not None:
            holders.setdefault(module_id, []).append(index)
    for module_id, indices in sorted(holders.items()):
        if len(indices) > 1:
            return (
                f"module {module_id} is given to GPU {indices[0]} and GPU {indices[1]}; "
                "each card has its own module id"
            )
    return ""


@transaction.atomic
def node_set_module_ids(
    *, node: Node, module_ids: Mapping[int, int | None], actor: Actor = None
) -> Node:
    """Set the module ids of some of a node's GPUs (GPU index -> module id, None to clear).
    All are checked together, so two cards may swap their ids in one call."""
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    gpus = {gpu.index: gpu for gpu in Gpu.objects.select_for_update(no_key=True).filter(node=node)}
    for index, module_id in module_ids.items():
        if index not in gpus:
            problem = f"GPU {index!r} is not a GPU of {node.hostname} (0..{node.gpu_count - 1})"
            raise ValidationError({"index": problem})
        problem = module_id_problem(module_id)
        if problem:
            raise ValidationError({"module_id": f"GPU {index}: {problem}"})
    wanted = {index: gpu.module_id for index, gpu in gpus.items()} | dict(module_ids)
    problem = module_ids_problem(wanted)
    if problem:
        raise ValidationError({"module_id": problem})
    changed = {i: m for i, m in module_ids.items() if gpus[i].module_id != m}
    if not changed:
        return node
    # Clear first: a swap must never hold one module id twice, even for a statement.
    Gpu.objects.filter(node=node, index__in=changed).update(module_id=None)
    for index, module_id in changed.items():
        if module_id is not None:
            Gpu.objects.filter(pk=gpus[index].pk).update(module_id=module_id)
    audit_record(
        actor=actor,
        verb="gpu.module_id",
        target=node,
        before={f"gpu{i}": gpus[i].module_id for i in sorted(changed)},
        after={f"gpu{i}": changed[i] for i in sorted(changed)},
    )
    return node


def gpu_set_module_id(*, gpu: Gpu, module_id: int | None, actor: Actor = None) -> Gpu:
    """Set (or with None clear) one GPU's Fabric Manager module id."""
    node_set_module_ids(node=gpu.node, module_ids={gpu.index: module_id}, actor=actor)
    return Gpu.objects.select_related("node").get(pk=gpu.pk)


@transaction.atomic
def node_set_fabric_partitions(
    *,
    node: Node,
    fabric_partitions: Sequence[tuple[int, Sequence[int]]],
    actor: Actor = None,
) -> Node:
    """Store a node's partition table as Fabric Manager lists it: ``fabric_partitions`` holds
    (Fabric Manager partition id, GPU module ids) pairs in listed order. The module ids are
    mapped to GPU indices through the node's GPUs' module ids, and the table must pass the
    rules every partition table passes. Any problem refuses the whole table, naming each
    partition by Fabric Manager's id, and changes nothing."""
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    if node.fabric != "nvswitch":
        problem = f"{node.hostname} is {node.fabric}; only NVSwitch nodes have NVLink partitions"
        raise ValidationError({"partitions": problem})
    index_of = dict(
        Gpu.objects.filter(node=node, module_id__isnull=False).values_list("module_id", "index")
    )
    if not index_of:
        raise ValidationError(
            {
                "partitions": f"no GPU of {node.hostname} has a Fabric Manager module id; set "
                "each GPU's module_id first (fleet file gpu_list, the API or the admin)"
            }
        )
    problems, table, ids, names = [], [], [], []
    seen_ids: set[int] = set()
    for partition_id, modules in fabric_partitions:
        name = f"Fabric Manager partition {partition_id} (modules {', '.join(map(str, modules))})"
        if partition_id in seen_ids:
            problems.append(f"{name}: partition id {partition_id} is listed twice")
            continue
        seen_ids.add(partition_id)
        unknown = [module for module in modules if module not in index_of]
        if unknown:
            problems.append(
                f"{name} names module {unknown[0]}, which no GPU of {node.hostname} carries "
                f"(its GPUs carry modules {', '.join(map(str, sorted(index_of)))})"
            )
            continue
        table.append(sorted(index_of[module] for module in modules))
        ids.append(partition_id)
        names.append(f"{name} = GPUs")
    if not problems:
        problems = rules.node_partitions_problems(
            fabric=node.fabric, gpu_count=node.gpu_count, partitions=table, names=names
        )
    if problems:
        raise ValidationError({"partitions": problems})
    before = {"partitions": node.partitions, "fabric_partition_ids": node.fabric_partition_ids}
    after = {"partitions": table, "fabric_partition_ids": ids}
    if after == before:
        return node
    Node.objects.filter(pk=node.pk).update(
        partitions=table, fabric_partition_ids=ids, updated_at=timezone.now()
    )
    node.partitions, node.fabric_partition_ids = table, ids
    if table != before["partitions"]:
        capacity_set_bump(capacity_set_id=node.capacity_set_id)
    audit_record(
        actor=actor,
        verb="node.fabric_partitions",
        target=node,
        before=before,
        after=after,
        message="from Fabric Manager's partition listing",
    )
    return node


def fabric_ids_kept(
    *, old_table: list | None, old_ids: list | None, new_table: list | None
) -> list | None:
    """Fabric Manager's ids for ``new_table`` where its partitions were in the old table: an
    operator's edit of the table keeps what Fabric Manager said of the partitions it kept."""
    if not old_table or not old_ids or not new_table:
        return None
    known = {tuple(sorted(block)): pid for block, pid in zip(old_table, old_ids, strict=True)}
    ids = [known.get(tuple(sorted(block))) for block in new_table]
    return ids if any(pid is not None for pid in ids) else None
