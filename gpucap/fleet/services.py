"""Every change to the fleet goes through here: validated, atomic, audited, and bumping the
capacity set's generation whenever the change could alter a plan."""

import uuid

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, ProtectedError, RestrictedError, Sum
from django.utils import timezone

from gpucap.arbiter.topology import partition_table_problems
from gpucap.audit.services import Actor, audit_record
from gpucap.errors import Conflict
from gpucap.fleet.models import MAX_GPUS_PER_NODE, CapacitySet, Cluster, Fabric, Gpu, Node, Pool
from gpucap.plans.triggers import replan_soon

# PCI bus ids of the eight GPUs on a typical HGX baseboard, used for generated GPUs.
_HGX_PCI_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


def capacity_set_bump(*, capacity_set_id: int | None) -> None:
    """Record that something a plan depends on changed, and ask for a prompt replan of the set
    once the change commits. A no-op for standalone nodes/pools."""
    if capacity_set_id is None:
        return
    CapacitySet.objects.filter(pk=capacity_set_id).update(
        generation=F("generation") + 1, updated_at=timezone.now()
    )
    replan_soon(capacity_set_id)


def _field_change(obj, field: str, value, *, verb: str, actor: Actor, capacity_set_id=None):
    """Set one field of a locked row, bump the set's generation when the change can alter a
    plan (``capacity_set_id`` given) and audit it. Setting the value it already has is a no-op."""
    before = getattr(obj, field)
    if before == value:
        return obj
    setattr(obj, field, value)
    extra = ["updated_at"] if any(f.name == "updated_at" for f in obj._meta.fields) else []
    obj.save(update_fields=[field, *extra])
    capacity_set_bump(capacity_set_id=capacity_set_id)
    audit_record(actor=actor, verb=verb, target=obj, before={field: before}, after={field: value})
    return obj


# --- clusters ---------------------------------------------------------------------------------


@transaction.atomic
def cluster_create(
    *,
    name: str,
    driver: str = Cluster.Driver.SIMULATED,
    driver_settings: dict | None = None,
    actor: Actor = None,
) -> Cluster:
    if driver not in Cluster.Driver.values:
        choices = ", ".join(Cluster.Driver.values)
        raise ValidationError({"driver": f"unknown driver {driver!r}; choose one of {choices}"})
    if Cluster.objects.filter(name=name).exists():
        raise ValidationError({"name": f"a cluster named {name!r} already exists"})
    cluster = Cluster(name=name, driver=driver, driver_settings=driver_settings or {})
    cluster.full_clean()
    cluster.save()
    audit_record(actor=actor, verb="cluster.create", target=cluster, after={"driver": driver})
    return cluster


# --- nodes ------------------------------------------------------------------------------------


def generated_gpu(*, cluster: Cluster, hostname: str, index: int) -> dict:
    """A stable UUID and a plausible PCI address for a GPU the fleet file did not list."""
    name = f"gpucap:{cluster.name}:{hostname}:{index}"
    bus = _HGX_PCI_BUSES[index % len(_HGX_PCI_BUSES)]
    return {
        "uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, name)}",
        "pci_address": f"0000:{bus}:00.0",
    }


@transaction.atomic
def node_create(
    *,
    cluster: Cluster,
    hostname: str,
    gpu_model: str,
    fabric: str,
    gpu_count: int,
    partitions: list[list[int]] | None = None,
    bmc_address: str = "",
    labels: dict | None = None,
    state: str = Node.State.READY,
    gpus: list[dict] | None = None,
    actor: Actor = None,
) -> Node:
    """Register a node and its GPUs. ``gpus`` lists {index, uuid, pci_address, health}; GPUs
    not listed get a generated UUID and PCI address."""
    errors: dict[str, str] = {}
    if Node.objects.filter(cluster=cluster, hostname=hostname).exists():
        errors["hostname"] = f"node {hostname!r} already exists in cluster {cluster.name}"
    if fabric not in Fabric.values:
        errors["fabric"] = f"unknown fabric {fabric!r}; choose pcie or nvswitch"
    if not isinstance(gpu_count, int) or not 1 <= gpu_count <= MAX_GPUS_PER_NODE:
        errors["gpu_count"] = f"must be between 1 and {MAX_GPUS_PER_NODE}, got {gpu_count!r}"
    if state not in Node.State.values:
        errors["state"] = f"unknown state {state!r}; choose one of {', '.join(Node.State.values)}"
    if not gpu_model:
        errors["gpu_model"] = "is required"
    if partitions is not None and not errors:
        problem = _partitions_problem(fabric=fabric, gpu_count=gpu_count, partitions=partitions)
        if problem:
            errors["partitions"] = problem
    if labels is not None and _labels_problem(labels):
        errors["labels"] = _labels_problem(labels)
    if errors:
        raise ValidationError(errors)
    # GPU rows are checked only for an otherwise valid node: a wrong count or a duplicate
    # hostname would otherwise also surface as confusing GPU errors.
    gpu_rows = _gpu_rows(cluster=cluster, hostname=hostname, gpu_count=gpu_count, gpus=gpus or [])
    if isinstance(gpu_rows, str):
        raise ValidationError({"gpus": gpu_rows})

    node = Node.objects.create(
        cluster=cluster,
        hostname=hostname,
        gpu_model=gpu_model,
        fabric=fabric,
        gpu_count=gpu_count,
        partitions=partitions or None,
        bmc_address=bmc_address,
        labels=labels or {},
        state=state,
    )
    Gpu.objects.bulk_create(Gpu(node=node, **row) for row in gpu_rows)
    audit_record(
        actor=actor,
        verb="node.create",
        target=node,
        after={"gpu_model": gpu_model, "fabric": fabric, "gpu_count": gpu_count},
    )
    return node


def _partitions_problem(*, fabric: str, gpu_count: int, partitions: object) -> str:
    if fabric != Fabric.NVSWITCH:
        return "only NVSwitch nodes carry a partition table"
    problems = partition_table_problems(partitions, gpu_count)
    return "; ".join(problems)


def _labels_problem(labels: object) -> str:
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        return "must be a mapping of text keys to text values"
    return ""


def _gpu_rows(*, cluster: Cluster, hostname: str, gpu_count: int, gpus: list[dict]) -> list | str:
    listed: dict[int, dict] = {}
    for gpu in gpus:
        index = gpu.get("index")
        if not isinstance(index, int) or not 0 <= index < gpu_count:
            return f"GPU index {index!r} is out of range for a {gpu_count}-GPU node"
        if index in listed:
            return f"GPU index {index} is listed twice"
        listed[index] = gpu
    rows = []
    for index in range(gpu_count):
        row = {"index": index, **generated_gpu(cluster=cluster, hostname=hostname, index=index)}
        given = listed.get(index, {})
        for field in ("uuid", "pci_address", "health"):
            if given.get(field):
                row[field] = given[field]
        rows.append(row)
    pci = [row["pci_address"] for row in rows]
    if len(set(pci)) != len(pci):
        return "two GPUs share one PCI address"
    uuids = [row["uuid"] for row in rows]
    if len(set(uuids)) != len(uuids) or Gpu.objects.filter(uuid__in=uuids).exists():
        return "a GPU UUID is already registered"
    return rows


@transaction.atomic
def node_update(
    *,
    node: Node,
    partitions: list[list[int]] | None = ...,  # type: ignore[assignment]
    bmc_address: str | None = None,
    labels: dict | None = None,
    actor: Actor = None,
) -> Node:
    """Change a node's descriptive fields. A partition table change alters what can be placed,
    so it bumps the set's generation."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    before = {"partitions": node.partitions, "bmc_address": node.bmc_address, "labels": node.labels}
    if partitions is not ...:
        if partitions is not None:
            problem = _partitions_problem(
                fabric=node.fabric, gpu_count=node.gpu_count, partitions=partitions
            )
            if problem:
                raise ValidationError({"partitions": problem})
        node.partitions = partitions or None
    if bmc_address is not None:
        node.bmc_address = bmc_address
    if labels is not None:
        if _labels_problem(labels):
            raise ValidationError({"labels": _labels_problem(labels)})
        node.labels = labels
    after = {"partitions": node.partitions, "bmc_address": node.bmc_address, "labels": node.labels}
    if after == before:
        return node
    node.save()
    if after["partitions"] != before["partitions"]:
        capacity_set_bump(capacity_set_id=node.capacity_set_id)
    audit_record(actor=actor, verb="node.update", target=node, before=before, after=after)
    return node


# Which states an operator may move a node between, and the audit verb for each move.
_NODE_TRANSITIONS = {
    ("ready", "cordoned"): "node.cordon",
    ("draining", "cordoned"): "node.cordon",
    ("cordoned", "ready"): "node.uncordon",
    ("draining", "ready"): "node.uncordon",
    ("ready", "down"): "node.mark_down",
    ("cordoned", "down"): "node.mark_down",
    ("draining", "down"): "node.mark_down",
    ("down", "cordoned"): "node.mark_up",
    # Started only by gpucap.notices.drains.node_drain, which also warns the node's guests.
    ("ready", "draining"): "node.drain",
    ("cordoned", "draining"): "node.drain",
}


@transaction.atomic
def node_set_state(*, node: Node, state: str, actor: Actor = None, message: str = "") -> Node:
    """Move a node between ready/cordoned/down. A node back from down stays cordoned until an
    operator uncordons it (it may need checks first). Draining is started by the drain service."""
    if state not in Node.State.values:
        raise ValidationError({"state": f"unknown state {state!r}"})
    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.state == state:
        return node
    verb = _NODE_TRANSITIONS.get((node.state, state))
    if verb is None:
        raise Conflict(f"node {node.hostname} is {node.state}; it cannot become {state}")
    before = node.state
    Node.objects.filter(pk=node.pk, state=before).update(state=state, updated_at=timezone.now())
    node.state = state
    capacity_set_bump(capacity_set_id=node.capacity_set_id)
    audit_record(
        actor=actor,
        verb=verb,
        target=node,
        before={"state": before},
        after={"state": state},
        message=message,
    )
    return node


def node_cordon(*, node: Node, actor: Actor = None) -> Node:
    return node_set_state(node=node, state=Node.State.CORDONED, actor=actor)


def node_uncordon(*, node: Node, actor: Actor = None) -> Node:
    return node_set_state(node=node, state=Node.State.READY, actor=actor)


@transaction.atomic
def gpu_set_health(*, gpu: Gpu, health: str, actor: Actor = None) -> Gpu:
    if health not in Gpu.Health.values:
        raise ValidationError({"health": f"unknown health {health!r}; choose ok or failed"})
    gpu = Gpu.objects.select_for_update().select_related("node").get(pk=gpu.pk)
    return _field_change(
        gpu,
        "health",
        health,
        verb="gpu.health",
        actor=actor,
        capacity_set_id=gpu.node.capacity_set_id,
    )


# --- capacity sets ----------------------------------------------------------------------------


@transaction.atomic
def capacity_set_create(
    *,
    cluster: Cluster,
    name: str,
    gpu_model: str,
    fabric: str,
    notice_seconds: int = 120,
    actor: Actor = None,
) -> CapacitySet:
    errors = {}
    if CapacitySet.objects.filter(name=name).exists():
        errors["name"] = f"a capacity set named {name!r} already exists"
    if fabric not in Fabric.values:
        errors["fabric"] = f"unknown fabric {fabric!r}; choose pcie or nvswitch"
    if not gpu_model:
        errors["gpu_model"] = "is required"
    if not isinstance(notice_seconds, int) or not 1 <= notice_seconds <= 86400:
        errors["notice_seconds"] = f"must be between 1 and 86400 seconds, got {notice_seconds!r}"
    if errors:
        raise ValidationError(errors)
    # A new set always starts in dry-run: operators preview before the arbiter acts.
    capacity_set = CapacitySet.objects.create(
        cluster=cluster,
        name=name,
        gpu_model=gpu_model,
        fabric=fabric,
        notice_seconds=notice_seconds,
    )
    audit_record(
        actor=actor,
        verb="capacity_set.create",
        target=capacity_set,
        after={"cluster": cluster.name, "gpu_model": gpu_model, "fabric": fabric},
    )
    return capacity_set


@transaction.atomic
def capacity_set_update(
    *, capacity_set: CapacitySet, notice_seconds: int, actor: Actor = None
) -> CapacitySet:
    if not isinstance(notice_seconds, int) or not 1 <= notice_seconds <= 86400:
        raise ValidationError(
            {"notice_seconds": f"must be between 1 and 86400 seconds, got {notice_seconds!r}"}
        )
    capacity_set = CapacitySet.objects.select_for_update().get(pk=capacity_set.pk)
    # The notice length changes no plan: no generation bump.
    return _field_change(
        capacity_set, "notice_seconds", notice_seconds, verb="capacity_set.update", actor=actor
    )


def capacity_set_gpu_total(*, capacity_set: CapacitySet) -> int:
    return capacity_set.nodes.aggregate(total=Sum("gpu_count"))["total"] or 0


@transaction.atomic
def node_join_set(*, node: Node, capacity_set: CapacitySet, actor: Actor = None) -> Node:
    """Put a node into a capacity set of its own cluster, GPU model and fabric."""
    node = Node.objects.select_for_update().select_related("cluster").get(pk=node.pk)
    if node.capacity_set_id == capacity_set.pk:
        return node
    if node.capacity_set_id is not None:
        raise Conflict(
            f"node {node.hostname} is already in capacity set {node.capacity_set.name}; "
            "remove it from that set first",
            code="node_in_other_set",
        )
    mismatches = []
    if node.cluster_id != capacity_set.cluster_id:
        mismatches.append(
            f"cluster {node.cluster.name} is not the set's cluster {capacity_set.cluster.name}"
        )
    if node.gpu_model != capacity_set.gpu_model:
        mismatches.append(f"GPU model {node.gpu_model} is not the set's {capacity_set.gpu_model}")
    if node.fabric != capacity_set.fabric:
        mismatches.append(f"fabric {node.fabric} is not the set's {capacity_set.fabric}")
    if mismatches:
        raise ValidationError(
            {
                "capacity_set": f"node {node.hostname} cannot join {capacity_set.name}: "
                + "; ".join(mismatches)
            }
        )
    node.capacity_set = capacity_set
    node.save(update_fields=["capacity_set", "updated_at"])
    capacity_set_bump(capacity_set_id=capacity_set.pk)
    audit_record(
        actor=actor,
        verb="capacity_set.add_node",
        target=capacity_set,
        after={"node": node.hostname},
    )
    return node


@transaction.atomic
def node_leave_set(*, node: Node, actor: Actor = None) -> Node:
    node = (
        Node.objects.select_for_update(of=("self",)).select_related("capacity_set").get(pk=node.pk)
    )
    capacity_set = node.capacity_set
    if capacity_set is None:
        return node
    _lock_set(capacity_set)
    remaining = capacity_set_gpu_total(capacity_set=capacity_set) - node.gpu_count
    held_floor = capacity_set.pools.aggregate(total=Sum("floor_gpus"))["total"] or 0
    if held_floor > remaining:
        raise Conflict(
            f"removing {node.hostname} would leave {capacity_set.name} with {remaining} GPUs, "
            f"less than its pools' floors ({held_floor} GPUs); lower the floors first",
            code="floors_exceed_capacity",
        )
    node.capacity_set = None
    node.save(update_fields=["capacity_set", "updated_at"])
    capacity_set_bump(capacity_set_id=capacity_set.pk)
    audit_record(
        actor=actor,
        verb="capacity_set.remove_node",
        target=capacity_set,
        before={"node": node.hostname},
    )
    return node


# --- pools ------------------------------------------------------------------------------------


@transaction.atomic
def pool_create(
    *,
    name: str,
    kind: str,
    cluster: Cluster,
    capacity_set: CapacitySet | None = None,
    rank: int,
    floor_gpus: int = 0,
    gpu_model: str = "",
    fabric: str = "",
    actor: Actor = None,
) -> Pool:
    """A pool in a capacity set rents the set's GPU model and fabric (given or not); a
    standalone pool names the model and fabric of the standalone nodes it places on."""
    # Lock the set (or, for a standalone pool, the cluster) first: two pools created at once
    # must not both pass the rank check.
    if capacity_set is not None and capacity_set.cluster_id == cluster.pk:
        _lock_set(capacity_set)
    else:
        Cluster.objects.select_for_update().filter(pk=cluster.pk).first()
    errors = {}
    if Pool.objects.filter(name=name).exists():
        errors["name"] = f"a pool named {name!r} already exists"
    if kind not in Pool.Kind.values:
        errors["kind"] = f"unknown kind {kind!r}; choose one of {', '.join(Pool.Kind.values)}"
    if capacity_set is not None and capacity_set.cluster_id != cluster.pk:
        errors["capacity_set"] = (
            f"capacity set {capacity_set.name} belongs to cluster {capacity_set.cluster.name}, "
            f"not {cluster.name}"
        )
    if capacity_set is not None:
        for field, value, wanted in (
            ("gpu_model", gpu_model, capacity_set.gpu_model),
            ("fabric", fabric, capacity_set.fabric),
        ):
            if value and value != wanted:
                errors[field] = f"a pool of {capacity_set.name} rents its {wanted}, not {value}"
        gpu_model, fabric = capacity_set.gpu_model, capacity_set.fabric
    else:
        if not gpu_model:
            errors["gpu_model"] = "a standalone pool must name the GPU model it rents"
        if fabric not in Fabric.values:
            errors["fabric"] = (
                f"a standalone pool must name its fabric: pcie or nvswitch, got {fabric!r}"
            )
    if not isinstance(rank, int) or rank < 1:
        errors["rank"] = f"must be a whole number of at least 1 (1 is the highest), got {rank!r}"
    elif _rank_taken(cluster=cluster, capacity_set=capacity_set, rank=rank):
        where = f"capacity set {capacity_set.name}" if capacity_set else f"cluster {cluster.name}"
        errors["rank"] = f"rank {rank} is already used by another pool in {where}"
    if errors:
        raise ValidationError(errors)
    _check_floor(
        capacity_set=capacity_set, floor_gpus=floor_gpus, other_pools=_pools_of(capacity_set)
    )
    pool = Pool.objects.create(
        name=name,
        kind=kind,
        cluster=cluster,
        capacity_set=capacity_set,
        rank=rank,
        floor_gpus=floor_gpus,
        gpu_model=gpu_model,
        fabric=fabric,
    )
    capacity_set_bump(capacity_set_id=pool.capacity_set_id)
    audit_record(
        actor=actor,
        verb="pool.create",
        target=pool,
        after={
            "kind": kind,
            "capacity_set": capacity_set.name if capacity_set else None,
            "gpu_model": gpu_model,
            "fabric": fabric,
            "rank": rank,
            "floor_gpus": floor_gpus,
        },
    )
    return pool


def _rank_taken(*, cluster: Cluster, capacity_set: CapacitySet | None, rank: int) -> bool:
    if capacity_set is not None:
        return Pool.objects.filter(capacity_set=capacity_set, rank=rank).exists()
    return Pool.objects.filter(cluster=cluster, capacity_set=None, rank=rank).exists()


def _pools_of(capacity_set: CapacitySet | None):
    return Pool.objects.filter(capacity_set=capacity_set) if capacity_set else Pool.objects.none()


def _lock_set(capacity_set: CapacitySet) -> None:
    """Serialise changes to one set's pools (ranks, floors) behind its row lock."""
    CapacitySet.objects.select_for_update().filter(pk=capacity_set.pk).first()


def _check_floor(*, capacity_set: CapacitySet | None, floor_gpus: int, other_pools) -> None:
    if not isinstance(floor_gpus, int) or floor_gpus < 0:
        raise ValidationError({"floor_gpus": f"must be 0 or more GPUs, got {floor_gpus!r}"})
    if capacity_set is None:
        return
    total = capacity_set_gpu_total(capacity_set=capacity_set)
    others = other_pools.aggregate(total=Sum("floor_gpus"))["total"] or 0
    if floor_gpus + others > total:
        raise ValidationError(
            {
                "floor_gpus": f"a floor of {floor_gpus} GPUs plus the other pools' floors "
                f"({others}) exceeds the {total} GPUs of capacity set {capacity_set.name}"
            }
        )


@transaction.atomic
def pool_set_floor(*, pool: Pool, floor_gpus: int, actor: Actor = None) -> Pool:
    pool = Pool.objects.select_related("capacity_set").get(pk=pool.pk)
    if pool.capacity_set is not None:
        _lock_set(pool.capacity_set)
    pool = (
        Pool.objects.select_for_update(of=("self",)).select_related("capacity_set").get(pk=pool.pk)
    )
    _check_floor(
        capacity_set=pool.capacity_set,
        floor_gpus=floor_gpus,
        other_pools=_pools_of(pool.capacity_set).exclude(pk=pool.pk),
    )
    return _field_change(
        pool,
        "floor_gpus",
        floor_gpus,
        verb="pool.set_floor",
        actor=actor,
        capacity_set_id=pool.capacity_set_id,
    )


@transaction.atomic
def pool_rerank(
    *, capacity_set: CapacitySet, pool_names: list[str], actor: Actor = None
) -> list[Pool]:
    """Give the set's pools ranks 1..n in the order named. All pools of the set must be named
    exactly once; the change is atomic (no moment with two pools on one rank)."""
    _lock_set(capacity_set)
    pools = {p.name: p for p in Pool.objects.select_for_update().filter(capacity_set=capacity_set)}
    if not isinstance(pool_names, list) or not all(isinstance(n, str) for n in pool_names):
        raise ValidationError({"pools": "must be a list of pool names, highest priority first"})
    unknown = [n for n in pool_names if n not in pools]
    missing = sorted(set(pools) - set(pool_names))
    duplicated = sorted({n for n in pool_names if pool_names.count(n) > 1})
    problems = []
    if unknown:
        problems.append(f"not pools of {capacity_set.name}: {', '.join(unknown)}")
    if missing:
        problems.append(f"every pool of the set must be ranked; missing: {', '.join(missing)}")
    if duplicated:
        problems.append(f"named more than once: {', '.join(duplicated)}")
    if problems:
        raise ValidationError({"pools": "; ".join(problems)})
    before = {name: pool.rank for name, pool in pools.items()}
    after = {name: position for position, name in enumerate(pool_names, start=1)}
    if before == after:
        return sorted(pools.values(), key=lambda p: p.rank)
    # Two steps keep the unique (set, rank) constraint true at every statement.
    offset = max(max(before.values()), len(pools)) + 1
    Pool.objects.filter(capacity_set=capacity_set).update(rank=F("rank") + offset)
    for name, rank in after.items():
        Pool.objects.filter(pk=pools[name].pk).update(rank=rank)
    capacity_set_bump(capacity_set_id=capacity_set.pk)
    audit_record(
        actor=actor, verb="capacity_set.rerank", target=capacity_set, before=before, after=after
    )
    return list(Pool.objects.filter(capacity_set=capacity_set).order_by("rank"))


@transaction.atomic
def pool_set_tenants(*, pool: Pool, tenants: list, actor: Actor = None) -> Pool:
    """Say which tenants may use a pool."""
    before = sorted(pool.tenants.values_list("slug", flat=True))
    after = sorted(t.slug for t in tenants)
    if before != after:
        pool.tenants.set(tenants)
        audit_record(
            actor=actor,
            verb="pool.set_tenants",
            target=pool,
            before={"tenants": before},
            after={"tenants": after},
        )
    return pool


# --- added for fleet files (gpucap.fleet.fleetfile) ------------------------------------------


@transaction.atomic
def cluster_update(
    *, cluster: Cluster, driver: str, driver_settings: dict, actor: Actor = None
) -> Cluster:
    """Change which VM driver runs a cluster and its settings (e.g. a libvirt URI template)."""
    if driver not in Cluster.Driver.values:
        choices = ", ".join(Cluster.Driver.values)
        raise ValidationError({"driver": f"unknown driver {driver!r}; choose one of {choices}"})
    if not isinstance(driver_settings, dict):
        raise ValidationError({"driver_settings": "must be a mapping of setting names to values"})
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    before = {"driver": cluster.driver, "driver_settings": cluster.driver_settings}
    after = {"driver": driver, "driver_settings": driver_settings}
    if before == after:
        return cluster
    cluster.driver = driver
    cluster.driver_settings = driver_settings
    cluster.save(update_fields=["driver", "driver_settings"])
    audit_record(actor=actor, verb="cluster.update", target=cluster, before=before, after=after)
    return cluster


@transaction.atomic
def pool_rerank_standalone(
    *, cluster: Cluster, pool_names: list[str], actor: Actor = None
) -> list[Pool]:
    """Give a cluster's standalone pools ranks 1..n in the order named, like ``pool_rerank``
    does for a set. No generation to bump: standalone pools are outside every set."""
    Cluster.objects.select_for_update().filter(pk=cluster.pk).first()
    standalone = Pool.objects.filter(cluster=cluster, capacity_set=None)
    pools = {p.name: p for p in standalone.select_for_update(of=("self",))}
    if not isinstance(pool_names, list) or not all(isinstance(n, str) for n in pool_names):
        raise ValidationError({"pools": "must be a list of pool names, highest priority first"})
    problems = []
    unknown = [n for n in pool_names if n not in pools]
    missing = sorted(set(pools) - set(pool_names))
    duplicated = sorted({n for n in pool_names if pool_names.count(n) > 1})
    if unknown:
        problems.append(f"not standalone pools of cluster {cluster.name}: {', '.join(unknown)}")
    if missing:
        problems.append(f"every standalone pool must be ranked; missing: {', '.join(missing)}")
    if duplicated:
        problems.append(f"named more than once: {', '.join(duplicated)}")
    if problems:
        raise ValidationError({"pools": "; ".join(problems)})
    before = {name: pool.rank for name, pool in pools.items()}
    after = {name: position for position, name in enumerate(pool_names, start=1)}
    if before != after:
        # Two steps keep the unique (cluster, rank) constraint true at every statement.
        offset = max(max(before.values()), len(pools)) + 1
        standalone.update(rank=F("rank") + offset)
        for name, rank in after.items():
            Pool.objects.filter(pk=pools[name].pk).update(rank=rank)
        audit_record(
            actor=actor,
            verb="cluster.rerank_standalone",
            target=cluster,
            before=before,
            after=after,
        )
    return list(standalone.order_by("rank"))


# --- renames and deletes behind the REST API ---------------------------------------------------


@transaction.atomic
def cluster_rename(*, cluster: Cluster, name: str, actor: Actor = None) -> Cluster:
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    before = cluster.name
    if name == before:
        return cluster
    if Cluster.objects.filter(name=name).exists():
        raise ValidationError({"name": f"a cluster named {name!r} already exists"})
    cluster.name = name
    cluster.full_clean(exclude=["driver", "driver_settings"])
    cluster.save(update_fields=["name"])
    audit_record(
        actor=actor,
        verb="cluster.rename",
        target=cluster,
        before={"name": before},
        after={"name": name},
    )
    return cluster


@transaction.atomic
def cluster_delete(*, cluster: Cluster, actor: Actor = None) -> None:
    """Forget a cluster that no capacity set, node or pool belongs to any more."""
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    _delete_unused(
        cluster,
        what=f"cluster {cluster.name}",
        verb="cluster.delete",
        before={"driver": cluster.driver},
        actor=actor,
    )


@transaction.atomic
def node_delete(*, node: Node, actor: Actor = None) -> None:
    """Forget a node and its GPUs. A node in a capacity set must leave the set first, so the
    set's floors are checked on the way out."""
    node = (
        Node.objects.select_for_update(of=("self",))
        .select_related("cluster", "capacity_set")
        .get(pk=node.pk)
    )
    if node.capacity_set is not None:
        raise Conflict(
            f"node {node.hostname} is in capacity set {node.capacity_set.name}; "
            "remove it from the set before deleting it",
            code="node_in_set",
        )
    _delete_unused(
        node,
        what=f"node {node.hostname}",
        verb="node.delete",
        before={
            "cluster": node.cluster.name,
            "gpu_model": node.gpu_model,
            "fabric": node.fabric,
            "gpu_count": node.gpu_count,
            "state": node.state,
        },
        actor=actor,
    )


@transaction.atomic
def capacity_set_delete(*, capacity_set: CapacitySet, actor: Actor = None) -> None:
    """Forget a capacity set that has no nodes and no pools left."""
    capacity_set = CapacitySet.objects.select_for_update().get(pk=capacity_set.pk)
    _delete_unused(
        capacity_set,
        what=f"capacity set {capacity_set.name}",
        verb="capacity_set.delete",
        before={
            "gpu_model": capacity_set.gpu_model,
            "fabric": capacity_set.fabric,
            "mode": capacity_set.mode,
        },
        actor=actor,
    )


@transaction.atomic
def pool_delete(*, pool: Pool, actor: Actor = None) -> None:
    """Forget a pool that nothing runs in any more."""
    pool = Pool.objects.select_related("capacity_set").get(pk=pool.pk)
    if pool.capacity_set is not None:
        _lock_set(pool.capacity_set)
    capacity_set_id = pool.capacity_set_id
    _delete_unused(
        pool,
        what=f"pool {pool.name}",
        verb="pool.delete",
        before={
            "kind": pool.kind,
            "capacity_set": getattr(pool.capacity_set, "name", None),
            "rank": pool.rank,
            "floor_gpus": pool.floor_gpus,
        },
        actor=actor,
    )
    capacity_set_bump(capacity_set_id=capacity_set_id)


def _delete_unused(obj, *, what: str, verb: str, before: dict, actor: Actor) -> None:
    """Delete ``obj`` unless rows still point at it through a PROTECT foreign key; then say
    which rows, so the operator knows what to remove first."""
    audit_record(actor=actor, verb=verb, target=obj, before=before)
    try:
        with transaction.atomic():
            obj.delete()
    except ProtectedError as exc:
        raise Conflict(
            f"{what} is still used by {_describe_rows(exc.protected_objects)}; remove those first",
            code="in_use",
        ) from None
    except RestrictedError as exc:
        raise Conflict(
            f"{what} is still used by {_describe_rows(exc.restricted_objects)}; remove those first",
            code="in_use",
        ) from None


def _describe_rows(rows) -> str:
    """'2 capacity sets (h100-east, l40s-east) and 1 node (a100-001)'."""
    names: dict[str, list[str]] = {}
    plural: dict[str, str] = {}
    for row in rows:
        singular = str(row._meta.verbose_name)
        plural[singular] = str(row._meta.verbose_name_plural)
        names.setdefault(singular, []).append(str(row))
    parts = []
    for singular in sorted(names):
        listed = sorted(names[singular])
        shown = ", ".join(listed[:5]) + (f" and {len(listed) - 5} more" if len(listed) > 5 else "")
        noun = singular if len(listed) == 1 else plural[singular]
        parts.append(f"{len(listed)} {noun} ({shown})")
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
