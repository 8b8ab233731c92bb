"""Nodes and their GPUs: registering, describing, moving between states, joining and leaving
capacity sets, and forgetting them."""

import uuid

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from gpucap.audit.services import Actor, audit_record
from gpucap.errors import Conflict
from gpucap.fleet import rules
from gpucap.fleet.models import MAX_GPUS_PER_NODE, CapacitySet, Cluster, Fabric, Gpu, Node
from gpucap.fleet.services._common import capacity_set_bump, delete_unused, field_change, lock_set
from gpucap.fleet.services.capacity_sets import capacity_set_gpu_total
from gpucap.fleet.services.fabric import fabric_ids_kept, module_id_problem, module_ids_problem
from gpucap.fleet.signals import node_state_changing, node_went_down

# PCI bus ids of the eight GPUs on a typical HGX baseboard, used for generated GPUs.
_HGX_PCI_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


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
    guest_bridge: str = "",
    guest_subnet: str = "",
    actor: Actor = None,
) -> Node:
    """Register a node and its GPUs. ``gpus`` lists {index, uuid, pci_address, module_id,
    health}; GPUs not listed get a generated UUID and PCI address, and no module id.
    ``guest_subnet`` (with ``guest_bridge``) makes gpucap give the node's guests their
    addresses."""
    errors: dict[str, str] = _guest_network_errors(
        guest_bridge=guest_bridge, guest_subnet=guest_subnet, node=None
    )
    if problem := rules.hostname_problem(hostname):
        errors["hostname"] = problem
    elif Node.objects.filter(cluster=cluster, hostname=hostname).exists():
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
    if labels is not None and rules.labels_problem(labels):
        errors["labels"] = rules.labels_problem(labels)
    if errors:
        raise ValidationError(errors)
    # GPU rows are checked only for an otherwise valid node: a wrong count or a duplicate
    # hostname would otherwise also surface as confusing GPU errors.
    gpu_rows = _gpu_rows(cluster=cluster, hostname=hostname, gpu_count=gpu_count, gpus=gpus or [])
    if isinstance(gpu_rows, str):
        raise ValidationError({"gpus": gpu_rows})

    node = Node(
        cluster=cluster,
        hostname=hostname,
        gpu_model=gpu_model,
        fabric=fabric,
        gpu_count=gpu_count,
        partitions=partitions or None,
        bmc_address=bmc_address,
        labels=labels or {},
        state=state,
        guest_bridge=guest_bridge,
        guest_subnet=guest_subnet,
    )
    _save_guest_network(node, create=True)
    Gpu.objects.bulk_create(Gpu(node=node, **row) for row in gpu_rows)
    audit_record(
        actor=actor,
        verb="node.create",
        target=node,
        after={"gpu_model": gpu_model, "fabric": fabric, "gpu_count": gpu_count},
    )
    return node


def _partitions_problem(*, fabric: str, gpu_count: int, partitions: object) -> str:
    problems = rules.node_partitions_problems(
        fabric=fabric, gpu_count=gpu_count, partitions=partitions
    )
    return "; ".join(problems)


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
        if given.get("module_id") is not None:
            problem = module_id_problem(given["module_id"])
            if problem:
                return f"GPU {index} module_id {problem}"
            row["module_id"] = given["module_id"]
        rows.append(row)
    problem = module_ids_problem({row["index"]: row.get("module_id") for row in rows})
    if problem:
        return problem
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
    guest_bridge: str | None = None,
    guest_subnet: str | None = None,
    actor: Actor = None,
) -> Node:
    """Change a node's descriptive fields. A partition table change alters what can be placed,
    so it bumps the set's generation. The guest network changes only while no VM holds GPUs
    on the node: its guests keep the addresses and bridge they booted with."""
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    before = _described(node)
    if guest_bridge is not None or guest_subnet is not None:
        _guest_network_change(
            node,
            guest_bridge=node.guest_bridge if guest_bridge is None else guest_bridge,
            guest_subnet=node.guest_subnet if guest_subnet is None else guest_subnet,
        )
    if partitions is not ...:
        if partitions is not None:
            problem = _partitions_problem(
                fabric=node.fabric, gpu_count=node.gpu_count, partitions=partitions
            )
            if problem:
                raise ValidationError({"partitions": problem})
        node.partitions = partitions or None
        node.fabric_partition_ids = fabric_ids_kept(
            old_table=before["partitions"],
            old_ids=node.fabric_partition_ids,
            new_table=node.partitions,
        )
    if bmc_address is not None:
        node.bmc_address = bmc_address
    if labels is not None:
        if rules.labels_problem(labels):
            raise ValidationError({"labels": rules.labels_problem(labels)})
        node.labels = labels
    after = _described(node)
    if after == before:
        return node
    _save_guest_network(node, create=False)
    if after["partitions"] != before["partitions"]:
        capacity_set_bump(capacity_set_id=node.capacity_set_id)
    audit_record(actor=actor, verb="node.update", target=node, before=before, after=after)
    return node


def _described(node: Node) -> dict:
    return {
        "partitions": node.partitions,
        "bmc_address": node.bmc_address,
        "labels": node.labels,
        "guest_bridge": node.guest_bridge,
        "guest_subnet": node.guest_subnet,
    }


def _guest_network_errors(*, guest_bridge: str, guest_subnet: str, node: Node | None) -> dict:
    """Problems with a node's guest network, by field: each value, and a subnet that overlaps
    another node's (named)."""
    errors = rules.guest_network_problems(guest_bridge=guest_bridge, guest_subnet=guest_subnet)
    if guest_subnet and "guest_subnet" not in errors:
        other = _overlapping_node(guest_subnet, node=node)
        if other is not None:
            errors["guest_subnet"] = (
                f"{guest_subnet} overlaps {other.guest_subnet} of node {other.hostname} "
                f"(cluster {other.cluster.name}); guests are told apart by address across "
                "the fleet"
            )
    return errors


def _overlapping_node(guest_subnet: str, *, node: Node | None) -> Node | None:
    others = Node.objects.exclude(guest_subnet="").select_related("cluster").order_by("pk")
    if node is not None:
        others = others.exclude(pk=node.pk)
    for other in others.only("hostname", "guest_subnet", "cluster__name"):
        if rules.guest_subnets_overlap(guest_subnet, other.guest_subnet):
            return other
    return None


def _guest_network_change(node: Node, *, guest_bridge: str, guest_subnet: str) -> None:
    if (guest_bridge, guest_subnet) == (node.guest_bridge, node.guest_subnet):
        return
    errors = _guest_network_errors(guest_bridge=guest_bridge, guest_subnet=guest_subnet, node=node)
    if errors:
        raise ValidationError(errors)
    busy = node_guest_network_busy(node)
    if busy:
        raise Conflict(busy, code="node_busy")
    node.guest_bridge, node.guest_subnet = guest_bridge, guest_subnet


def node_guest_network_busy(node: Node) -> str:
    """Why the node's guest network cannot change now ("": it can): guests holding GPUs there
    booted with its bridge and an address from its subnet."""
    holding = Gpu.objects.filter(
        node=node, allocations__isnull=False, allocations__released_at__isnull=True
    )
    if not holding.exists():
        return ""
    return (
        f"node {node.hostname} has VMs holding GPUs; its guest bridge and subnet can change "
        "only when none do (drain it first)"
    )


def node_guest_network_problems(*, node: Node | None, guest_bridge: str, guest_subnet: str) -> dict:
    """What is wrong with giving ``node`` (None: a new one) this guest network, by field."""
    return _guest_network_errors(guest_bridge=guest_bridge, guest_subnet=guest_subnet, node=node)


def _save_guest_network(node: Node, *, create: bool) -> None:
    """Save the node; a subnet another transaction gave an overlapping node meanwhile (the
    database's exclusion constraint) is the same 400 as one found before."""
    try:
        with transaction.atomic():
            node.save(force_insert=create)
    except IntegrityError as exc:
        if "node_guest_subnets_disjoint" not in str(exc):
            raise
        raise ValidationError(
            {"guest_subnet": f"{node.guest_subnet} overlaps the guest subnet of another node"}
        ) from None


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
    operator uncordons it (it may need checks first). Draining is started by the drain service.
    A node marked down takes its VMs with it (``signals.node_went_down``)."""
    if state not in Node.State.values:
        raise ValidationError({"state": f"unknown state {state!r}"})
    # FOR NO KEY UPDATE, as every node and GPU lock here but a delete's: a placement on this
    # node holds its set's row (the generation bump) until its commit checks its references to
    # the node and GPUs (deferred foreign keys, FOR KEY SHARE). FOR UPDATE would wait for that
    # check while the placement waits for our bump: a deadlock (tests/notices/test_drain_race.py).
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    if node.state == state:
        return node
    verb = _NODE_TRANSITIONS.get((node.state, state))
    if verb is None:
        raise Conflict(f"node {node.hostname} is {node.state}; it cannot become {state}")
    node_state_changing.send(sender=Node, node=node, old=node.state, new=state)
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
    if state == Node.State.DOWN:
        # Its VMs are lost with it (rentals follows: spot back to pending, the rest failed).
        node_went_down.send(sender=Node, node_id=node.pk, hostname=node.hostname, message=message)
    return node


def node_cordon(*, node: Node, actor: Actor = None) -> Node:
    return node_set_state(node=node, state=Node.State.CORDONED, actor=actor)


def node_uncordon(*, node: Node, actor: Actor = None) -> Node:
    return node_set_state(node=node, state=Node.State.READY, actor=actor)


@transaction.atomic
def gpu_set_health(*, gpu: Gpu, health: str, actor: Actor = None) -> Gpu:
    if health not in Gpu.Health.values:
        raise ValidationError({"health": f"unknown health {health!r}; choose ok or failed"})
    gpu = Gpu.objects.select_for_update(no_key=True).select_related("node").get(pk=gpu.pk)
    return field_change(
        gpu,
        "health",
        health,
        verb="gpu.health",
        actor=actor,
        capacity_set_id=gpu.node.capacity_set_id,
    )


@transaction.atomic
def node_join_set(*, node: Node, capacity_set: CapacitySet, actor: Actor = None) -> Node:
    """Put a node into a capacity set of its own cluster, GPU model and fabric."""
    node = Node.objects.select_for_update(no_key=True).select_related("cluster").get(pk=node.pk)
    if node.capacity_set_id == capacity_set.pk:
        return node
    if node.capacity_set_id is not None:
        raise Conflict(
            f"node {node.hostname} is already in capacity set {node.capacity_set.name}; "
            "remove it from that set first",
            code="node_in_other_set",
        )
    # The set's cluster is loaded only when it is not the node's.
    same_cluster = node.cluster_id == capacity_set.cluster_id
    problem = rules.node_join_problem(
        hostname=node.hostname,
        cluster=node.cluster.name,
        gpu_model=node.gpu_model,
        fabric=node.fabric,
        set_name=capacity_set.name,
        set_cluster=node.cluster.name if same_cluster else capacity_set.cluster.name,
        set_gpu_model=capacity_set.gpu_model,
        set_fabric=capacity_set.fabric,
    )
    if problem:
        raise ValidationError({"capacity_set": problem})
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
        Node.objects.select_for_update(no_key=True, of=("self",))
        .select_related("capacity_set")
        .get(pk=node.pk)
    )
    capacity_set = node.capacity_set
    if capacity_set is None:
        return node
    lock_set(capacity_set)
    remaining = capacity_set_gpu_total(capacity_set=capacity_set) - node.gpu_count
    held_floor = capacity_set.pools.aggregate(total=Sum("floor_gpus"))["total"] or 0
    if not rules.floors_fit(floor_gpus=held_floor, set_gpus=remaining):
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
    delete_unused(
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
