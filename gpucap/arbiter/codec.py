"""Snapshot and plan files (DESIGN.md section 7): JSON in, frozen dataclasses out, and back.

`load_snapshot` reads a snapshot and raises `SnapshotError` carrying every problem found, one
line each: first the shape of each item (missing or unknown fields, wrong types), then the
checks of `validation` (references, GPU ranges, topology, duplicates). `dump_plan` writes a plan
with the keys of section 7 in a fixed order, so equal plans are equal bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import MISSING
from datetime import UTC, datetime
from itertools import chain

from gpucap.arbiter.model import (
    FABRICS,
    CapacitySet,
    Demand,
    Deployment,
    Node,
    Placement,
    Plan,
    Pool,
    Quota,
    Reservation,
    ReservationReport,
    Snapshot,
    Unsatisfied,
    Vm,
)
from gpucap.arbiter.validation import check_snapshot, item_label, one_line

__all__ = [
    "SnapshotError",
    "dump_plan",
    "format_time",
    "load_snapshot",
    "plan_to_dict",
    "snapshot_from_dict",
    "snapshot_to_dict",
]


class SnapshotError(ValueError):
    """The snapshot cannot be planned; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        problems = [one_line(problem) for problem in problems]
        super().__init__("\n".join(problems))
        self.problems = problems


def load_snapshot(text: str | bytes, *, keep: list | None = None) -> Snapshot:
    """The snapshot a JSON text holds. ``keep``: a list the parsed JSON is added to, for a
    caller that would rather not free it yet (the CLI ends without freeing anything)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SnapshotError([f"snapshot: not valid JSON: {error}"]) from None
    if keep is not None:
        keep.append(data)
    return snapshot_from_dict(data)


def snapshot_from_dict(data: object) -> Snapshot:
    """Build a snapshot from parsed JSON, or raise `SnapshotError` with every problem."""
    problems: list[str] = []
    if type(data) is not dict:
        raise SnapshotError([f"snapshot: must be a JSON object, got {_show(data)}"])
    reader = _Reader(problems)
    for key in data:
        if key not in _TOP_FIELDS:
            problems.append(f'snapshot: unknown field "{key}"')
    capacity_set = reader.capacity_set(data.get("set"), "set" in data)
    now = None
    if data.get("now") is not None:
        now = reader.time(data["now"], "snapshot", "now")
    nodes = reader.section(
        data, "nodes", _NODE_FIELDS, reader.node, required=True, quick=reader.node_quickly
    )
    pools = reader.section(data, "pools", _POOL_FIELDS, reader.pool, required=True)
    deployments = reader.section(
        data, "deployments", _DEPLOYMENT_FIELDS, reader.deployment, required=False
    )
    vms = reader.section(data, "vms", _VM_FIELDS, reader.vm, required=True, quick=reader.vm_quickly)
    demands = reader.section(
        data, "demands", _DEMAND_FIELDS, reader.demand, required=True, quick=reader.demand_quickly
    )
    quotas = reader.section(data, "quotas", _QUOTA_FIELDS, reader.quota, required=False)
    reservations = reader.section(
        data, "reservations", _RESERVATION_FIELDS, reader.reservation, required=False
    )
    if capacity_set is None:
        raise SnapshotError(problems)
    snapshot = Snapshot(
        capacity_set=capacity_set,
        nodes=tuple(item for _, item in nodes),
        pools=tuple(item for _, item in pools),
        vms=tuple(item for _, item in vms),
        demands=tuple(item for _, item in demands),
        deployments=tuple(item for _, item in deployments),
        now=now,
        quotas=tuple(item for _, item in quotas),
        reservations=tuple(item for _, item in reservations),
    )
    # Every section but the three read in one pass (below: labelled again on a problem).
    sections = {
        "pools": pools,
        "deployments": deployments,
        "quotas": quotas,
        "reservations": reservations,
        "unreadable": reader.unreadable,
    }
    found = check_snapshot(snapshot, nodes=nodes, vms=vms, demands=demands, **sections)
    if found and reader.unlabelled:
        # Sections read in one pass carry no labels (on a large fleet, wording ten thousand
        # labels costs more than checking the items): a problem found, check again with them.
        nodes, vms, demands = (
            reader.labelled(section, items)
            for section, items in (("nodes", nodes), ("vms", vms), ("demands", demands))
        )
        found = check_snapshot(snapshot, nodes=nodes, vms=vms, demands=demands, **sections)
    problems.extend(found)
    if problems:
        raise SnapshotError(problems)
    return snapshot


def snapshot_to_dict(snapshot: Snapshot) -> dict:
    """The section 7 JSON form of a snapshot (optional fields only where they differ)."""
    capacity_set = snapshot.capacity_set
    data: dict = {
        "set": {
            "name": capacity_set.name,
            "fabric": capacity_set.fabric,
            "gpu_model": capacity_set.gpu_model,
        },
    }
    if snapshot.now is not None:
        data["now"] = format_time(snapshot.now)
    data["nodes"] = [_node_to_dict(node) for node in snapshot.nodes]
    data["pools"] = [_pool_to_dict(pool) for pool in snapshot.pools]
    data["deployments"] = [
        {"name": d.name, "pool": d.pool, "min_replicas": d.min_replicas}
        for d in snapshot.deployments
    ]
    data["vms"] = [_vm_to_dict(vm) for vm in snapshot.vms]
    data["demands"] = [_demand_to_dict(d) for d in snapshot.demands]
    if snapshot.quotas:
        data["quotas"] = [
            {"tenant": q.tenant, "pool": q.pool, "max_gpus": q.max_gpus} for q in snapshot.quotas
        ]
    if snapshot.reservations:
        data["reservations"] = [
            {"id": r.id, "tenant": r.tenant, "gpus": r.gpus, "block_gpus": r.block_gpus}
            for r in snapshot.reservations
        ]
    return data


def _demand_to_dict(demand: Demand) -> dict:
    data = {
        "id": demand.id,
        "group": demand.group,
        "pool": demand.pool,
        "gpus": demand.gpus,
        "requested_at": format_time(demand.requested_at),
    }
    if demand.disk_node is not None:
        data["disk_node"] = demand.disk_node
    if demand.tenant is not None:
        data["tenant"] = demand.tenant
    return data


def plan_to_dict(plan: Plan) -> dict:
    """The section 7 JSON form of a plan, keys in a fixed order."""
    preemptions = []
    for p in plan.preemptions:
        entry = {
            "vm": p.vm,
            "pool": p.pool,
            "node": p.node,
            "gpus": list(p.gpus),
            "for": p.for_demand,
            "reason": p.reason,
        }
        if p.tenant is not None:
            entry["tenant"] = p.tenant
        preemptions.append(entry)
    data = {
        "complete": plan.complete,
        "placements": [_placement_to_dict(p) for p in plan.placements],
        "preemptions": preemptions,
        "unsatisfied": [_unsatisfied_to_dict(u) for u in plan.unsatisfied],
        "pools": [
            {
                "name": b.name,
                "before_gpus": b.before_gpus,
                "after_gpus": b.after_gpus,
                "floor_gpus": b.floor_gpus,
            }
            for b in plan.pools
        ],
    }
    if plan.reservations:
        data["reservations"] = [_reservation_report_to_dict(r) for r in plan.reservations]
    return data


def _placement_to_dict(placement: Placement) -> dict:
    data = {
        "demand": placement.demand,
        "node": placement.node,
        "gpus": list(placement.gpus),
        "preempts": list(placement.preempts),
    }
    if placement.reservation is not None:
        data["reservation"] = placement.reservation
    if placement.borrowed is not None:
        data["borrowed"] = placement.borrowed
    return data


def _reservation_report_to_dict(report: ReservationReport) -> dict:
    return {
        "id": report.id,
        "tenant": report.tenant,
        "gpus": report.gpus,
        "block_gpus": report.block_gpus,
        "short_gpus": report.short_gpus,
        "held_before": report.held_before,
        "held_after": report.held_after,
        "kept_gpus": report.kept_gpus,
        "borrowed": list(report.borrowed),
        "claim_reclaims": list(report.claim_reclaims),
        "claim_complete": report.claim_complete,
    }


def dump_plan(plan: Plan) -> str:
    """The plan as JSON text: one line per placement, preemption, unsatisfied demand and pool,
    so plans read well and diff well."""
    lines = ["{"]
    # What json.dumps(item, ensure_ascii=False) does, without a new encoder for every line.
    encode = json.JSONEncoder(ensure_ascii=False).encode
    data = plan_to_dict(plan)
    last = len(data) - 1
    for position, (key, value) in enumerate(data.items()):
        comma = "," if position < last else ""
        if isinstance(value, list) and value:
            lines.append(f"  {json.dumps(key)}: [")
            items = [f"    {encode(item)}" for item in value]
            lines.append(",\n".join(items))
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def format_time(moment: datetime) -> str:
    text = moment.astimezone(UTC).isoformat() if moment.tzinfo else moment.isoformat()
    return text.replace("+00:00", "Z")


def _pool_to_dict(pool: Pool) -> dict:
    data: dict = {
        "name": pool.name,
        "kind": pool.kind,
        "rank": pool.rank,
        "floor_gpus": pool.floor_gpus,
    }
    if pool.protect_seconds:
        data["protect_seconds"] = pool.protect_seconds
    return data


def _unsatisfied_to_dict(entry: Unsatisfied) -> dict:
    data: dict = {"demand": entry.demand, "group": entry.group, "reason": entry.reason}
    if entry.waits_until is not None:
        data["waits_until"] = format_time(entry.waits_until)
    return data


def _node_to_dict(node: Node) -> dict:
    data: dict = {"name": node.name, "gpus": node.gpus, "state": node.state}
    data["failed_gpus"] = list(node.failed_gpus)
    if node.partitions is not None:
        data["partitions"] = [list(block) for block in node.partitions]
    if node.tenant is not None:
        data["tenant"] = node.tenant
    return data


def _vm_to_dict(vm: Vm) -> dict:
    data: dict = {
        "id": vm.id,
        "pool": vm.pool,
        "node": vm.node,
        "gpus": list(vm.gpus),
        "started_at": format_time(vm.started_at),
    }
    if vm.deployment is not None:
        data["deployment"] = vm.deployment
    if vm.state != "running":
        data["state"] = vm.state
    if vm.tenant is not None:
        data["tenant"] = vm.tenant
    if vm.group is not None:
        data["group"] = vm.group
    if vm.borrowed is not None:
        data["borrowed"] = vm.borrowed
    if vm.reservation is not None:
        data["reservation"] = vm.reservation
    return data


# Fields of each item: (required, optional). The first required field names the item.
_TOP_FIELDS = frozenset(
    {"set", "now", "nodes", "pools", "deployments", "vms", "demands", "quotas", "reservations"}
)
_SET_FIELDS = (("name", "fabric", "gpu_model"), ())
_NODE_FIELDS = (("name", "gpus", "state"), ("failed_gpus", "partitions", "tenant"))
_POOL_FIELDS = (("name", "kind", "rank", "floor_gpus"), ("protect_seconds",))
_DEPLOYMENT_FIELDS = (("name", "pool", "min_replicas"), ())
_VM_FIELDS = (
    ("id", "pool", "node", "gpus", "started_at"),
    ("deployment", "state", "tenant", "group", "borrowed", "reservation"),
)
_DEMAND_FIELDS = (("id", "group", "pool", "gpus", "requested_at"), ("disk_node", "tenant"))
_QUOTA_FIELDS = (("tenant", "max_gpus"), ("pool",))
_RESERVATION_FIELDS = (("id", "tenant", "gpus"), ("block_gpus",))


_INT = frozenset({int})
_LIST = frozenset({list})


def _quickly(
    items: list,
    quick: Callable[[dict], object | None],
    required: frozenset[str],
    allowed: frozenset[str],
    name_field: str,
) -> list[tuple[str, object]] | None:
    """Every item of a section in one pass when each is well-formed and named (the usual
    case), unlabelled (`_Reader.labelled` labels them); None as soon as one is not."""
    out: list[tuple[str, object]] = []
    append = out.append
    for item in items:
        if type(item) is not dict:
            return None
        keys = item.keys()
        if not (keys >= required and allowed.issuperset(keys)):
            return None
        built = quick(item)
        if built is None:
            return None
        if not item[name_field]:
            return None
        append(("", built))
    return out


def _all_ints(values: list) -> bool:
    """Whether every value is a JSON integer (not a bool, whose type is not int)."""
    return _INT.issuperset(map(type, values))


def _fast_new(cls: type) -> Callable[..., object]:
    """Build a frozen slotted dataclass ``cls`` from its fields in order, as ``cls(*fields)``
    would (a field with a default may be left out at the end), without the frozen
    ``__init__``'s ``object.__setattr__`` call per field: the snapshot reader builds one per VM.
    (``cls`` must have no ``__post_init__`` and no default factories.)"""
    names = cls.__slots__
    setters = tuple(cls.__dict__[name].__set__ for name in names)
    fields = cls.__dataclass_fields__
    namespace: dict = {"new": object.__new__, "cls": cls}
    arguments = []
    for i, name in enumerate(names):
        default = fields[name].default
        if default is MISSING:
            arguments.append(f"a{i}")
        else:
            namespace[f"d{i}"] = default
            arguments.append(f"a{i}=d{i}")
    source = ", ".join(f"s{i}" for i in range(len(names)))
    body = "; ".join(f"s{i}(o, a{i})" for i in range(len(names)))
    # Generated from the class's own fields, as dataclasses generates __init__.
    exec(
        f"def make({source}):\n"
        f"    def new_item({', '.join(arguments)}):\n"
        f"        o = new(cls); {body}; return o\n"
        f"    return new_item",
        namespace,
    )
    return namespace["make"](*setters)


# Take every field in declaration order (a new field of Vm: add it to vm_quickly's call too).
_new_vm = _fast_new(Vm)
_new_node = _fast_new(Node)


def _show(value: object) -> str:
    """A JSON value as the file shows it, shortened for an error line."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


class _Reader:
    """Reads items field by field, noting every problem instead of stopping at the first."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        self.unreadable: dict[str, set[str]] = {}
        self._times: dict[str, datetime] = {}
        self._tables: dict[tuple, tuple] = {}
        # Sections read in one pass, unlabelled: section -> the field that names an item.
        self.unlabelled: dict[str, str] = {}

    def labelled(self, section: str, items: list[tuple[str, object]]) -> list[tuple[str, object]]:
        """A section's items with their labels, as `item_label` words them (items read in one
        pass are named: `_quickly` takes no item without a name)."""
        name_field = self.unlabelled.get(section)
        if name_field is None:
            return items
        return [
            (f"{section}[{index}] ({getattr(item, name_field)})", item)
            for index, (_, item) in enumerate(items)
        ]

    def section(
        self,
        data: dict,
        section: str,
        fields: tuple[tuple[str, ...], tuple[str, ...]],
        build: Callable[[dict, str], object | None],
        *,
        required: bool,
        quick: Callable[[dict], object | None] | None = None,
    ) -> list[tuple[str, object]]:
        """The section's items as (label, item); ``build`` reads one item and words its
        problems. ``quick`` builds a well-formed item without a word, or returns None: when it
        builds every item, the section is read in one pass; else item by item with ``build``."""
        if section not in data:
            if required:
                self.problems.append(f'snapshot: missing field "{section}"')
            return []
        items = data[section]
        if type(items) is not list:
            self.problems.append(f"{section}: must be a list, got {_show(items)}")
            return []
        required_fields, optional_fields = fields
        required_set = frozenset(required_fields)
        allowed = required_set | frozenset(optional_fields)
        name_field = required_fields[0]
        if quick is not None:
            out = _quickly(items, quick, required_set, allowed, name_field)
            if out is not None:
                self.unlabelled[section] = name_field
                return out
        out = []
        problems = self.problems
        for index, item in enumerate(items):
            if type(item) is not dict:
                problems.append(f"{section}[{index}]: must be an object, got {_show(item)}")
                continue
            name = item.get(name_field)
            label = item_label(section, index, name)
            before = len(problems)
            keys = item.keys()
            if not (keys >= required_set and keys <= allowed):
                self._report_fields(item, label, required_fields, allowed)
            built = build(item, label)
            if built is None or len(problems) > before:
                if isinstance(name, str):
                    self.unreadable.setdefault(section, set()).add(name)
                continue
            out.append((label, built))
        return out

    def _report_fields(
        self, item: dict, label: str, required: tuple[str, ...], allowed: frozenset[str]
    ) -> None:
        for key in required:
            if key not in item:
                self.problems.append(f'{label}: missing field "{key}"')
        for key in item:
            if key not in allowed:
                self.problems.append(f'{label}: unknown field "{key}"')

    def capacity_set(self, raw: object, present: bool) -> CapacitySet | None:
        if not present:
            self.problems.append('snapshot: missing field "set"')
            return None
        if type(raw) is not dict:
            self.problems.append(f"set: must be an object, got {_show(raw)}")
            return None
        required, _ = _SET_FIELDS
        before = len(self.problems)
        self._report_fields(raw, "set", required, frozenset(required))
        name = self.text(raw, "set", "name")
        gpu_model = self.text(raw, "set", "gpu_model")
        fabric = self.text(raw, "set", "fabric")
        if fabric is not None and fabric not in FABRICS:
            self.problems.append(f"set: fabric must be one of pcie, nvswitch, got {_show(fabric)}")
        if len(self.problems) > before:
            return None
        return CapacitySet(name=name, fabric=fabric, gpu_model=gpu_model)

    def node(self, item: dict, label: str) -> Node | None:
        return self.node_quickly(item) or self._node_slowly(item, label)

    def node_quickly(self, item: dict) -> Node | None:
        """A well-formed node, read without the per-field helpers (None: let them word its
        problems). Partition tables repeat across a fleet: equal ones share one tuple."""
        name, gpus, state = item.get("name"), item.get("gpus"), item.get("state")
        failed = item.get("failed_gpus")
        if failed is None:
            failed = ()
        elif type(failed) is list and _all_ints(failed):
            failed = tuple(failed)
        else:
            failed = None
        raw_partitions = item.get("partitions")
        partitions = None
        if raw_partitions is not None:
            partitions = self._partitions(raw_partitions)
        tenant = item.get("tenant")
        if (
            type(name) is str
            and type(gpus) is int
            and type(state) is str
            and failed is not None
            and (raw_partitions is None or partitions is not None)
            and (tenant is None or type(tenant) is str)
        ):
            return _new_node(name, gpus, state, failed, partitions, tenant)
        return None

    def _partitions(self, raw: object) -> tuple[tuple[int, ...], ...] | None:
        """A well-formed partition table as sorted tuples (shared between equal tables), or
        None for the helpers to word its problems. Fleets repeat a few tables: each distinct
        one as written is sorted once."""
        if type(raw) is not list or not _LIST.issuperset(map(type, raw)):
            return None
        if not _INT.issuperset(map(type, chain.from_iterable(raw))):
            return None
        written = tuple(map(tuple, raw))
        table = self._tables.get(written)
        if table is None:
            table = tuple(tuple(sorted(block)) for block in written)
            # Keyed both as written and sorted: a sorted table is its own key.
            table = self._tables.setdefault(table, table)
            self._tables[written] = table
        return table

    def _node_slowly(self, item: dict, label: str) -> Node | None:
        name = self.text(item, label, "name")
        gpus = self.integer(item, label, "gpus")
        state = self.text(item, label, "state")
        failed = self.indices(item, label, "failed_gpus", optional=True)
        partitions = None
        raw_partitions = item.get("partitions")
        if raw_partitions is not None:
            if type(raw_partitions) is not list:
                self.problems.append(
                    f"{label}: partitions must be a list of GPU index lists, got "
                    f"{_show(raw_partitions)}"
                )
            else:
                blocks = []
                for position, block in enumerate(raw_partitions):
                    if type(block) is not list or not all(type(i) is int for i in block):
                        self.problems.append(
                            f"{label}: partitions[{position}] must be a list of GPU indices, got "
                            f"{_show(block)}"
                        )
                    else:
                        blocks.append(tuple(sorted(block)))
                partitions = tuple(blocks)
        tenant = self.text(item, label, "tenant", optional=True)
        if None in (name, gpus, state, failed):
            return None
        return Node(
            name=name,
            gpus=gpus,
            state=state,
            failed_gpus=failed,
            partitions=partitions,
            tenant=tenant,
        )

    def pool(self, item: dict, label: str) -> Pool | None:
        name = self.text(item, label, "name")
        kind = self.text(item, label, "kind")
        rank = self.integer(item, label, "rank")
        floor_gpus = self.integer(item, label, "floor_gpus")
        protect_seconds = (
            self.integer(item, label, "protect_seconds") if "protect_seconds" in item else 0
        )
        if None in (name, kind, rank, floor_gpus, protect_seconds):
            return None
        return Pool(
            name=name, kind=kind, rank=rank, floor_gpus=floor_gpus, protect_seconds=protect_seconds
        )

    def deployment(self, item: dict, label: str) -> Deployment | None:
        name = self.text(item, label, "name")
        pool = self.text(item, label, "pool")
        min_replicas = self.integer(item, label, "min_replicas")
        if None in (name, pool, min_replicas):
            return None
        return Deployment(name=name, pool=pool, min_replicas=min_replicas)

    def vm(self, item: dict, label: str) -> Vm | None:
        return self.vm_quickly(item) or self._vm_slowly(item, label)

    def vm_quickly(self, item: dict) -> Vm | None:
        """A well-formed VM, read without the per-field helpers (None: let them word its
        problems). Fleets have tens of thousands of VMs."""
        get = item.get
        vm_id, pool, node = get("id"), get("pool"), get("node")
        gpus, started = get("gpus"), get("started_at")
        deployment, tenant = get("deployment"), get("tenant")
        state = get("state", "running")
        if (
            type(vm_id) is str
            and type(pool) is str
            and type(node) is str
            and type(started) is str
            and type(gpus) is list
            and _INT.issuperset(map(type, gpus))
            and (deployment is None or type(deployment) is str)
            and (tenant is None or type(tenant) is str)
            and "group" not in item  # a job member: read by _vm_slowly
            and "borrowed" not in item  # a borrower: read by _vm_slowly
            and "reservation" not in item  # placed inside a reservation: read by _vm_slowly
            and type(state) is str
        ):
            moment = self._times.get(started) or self._parse_time(started)
            if moment is not None:
                return _new_vm(
                    vm_id, pool, node, tuple(sorted(gpus)), moment, deployment, state, tenant
                )
        return None

    def _vm_slowly(self, item: dict, label: str) -> Vm | None:
        vm_id = self.text(item, label, "id")
        pool = self.text(item, label, "pool")
        node = self.text(item, label, "node")
        gpus = self.indices(item, label, "gpus")
        started_at = self.time(item.get("started_at"), label, "started_at", "started_at" in item)
        deployment = self.text(item, label, "deployment", optional=True)
        state = self.text(item, label, "state", optional=True) or "running"
        tenant = self.text(item, label, "tenant", optional=True)
        group = self.text(item, label, "group", optional=True)
        borrowed = self.text(item, label, "borrowed", optional=True)
        reservation = self.text(item, label, "reservation", optional=True)
        if None in (vm_id, pool, node, gpus, started_at):
            return None
        return Vm(
            id=vm_id,
            pool=pool,
            node=node,
            gpus=tuple(sorted(gpus)),
            started_at=started_at,
            deployment=deployment,
            state=state,
            tenant=tenant,
            group=group,
            borrowed=borrowed,
            reservation=reservation,
        )

    def demand(self, item: dict, label: str) -> Demand | None:
        return self.demand_quickly(item) or self._demand_slowly(item, label)

    def demand_quickly(self, item: dict) -> Demand | None:
        """A well-formed demand, read without the per-field helpers (None: let them word its
        problems)."""
        demand_id, group, pool = item.get("id"), item.get("group"), item.get("pool")
        gpus, requested, disk_node, tenant = (
            item.get("gpus"),
            item.get("requested_at"),
            item.get("disk_node"),
            item.get("tenant"),
        )
        moment = self._parse_time(requested) if type(requested) is str else None
        if (
            moment is not None
            and type(demand_id) is str
            and type(group) is str
            and type(pool) is str
            and type(gpus) is int
            and (disk_node is None or type(disk_node) is str)
            and (tenant is None or type(tenant) is str)
        ):
            return Demand(
                id=demand_id,
                group=group,
                pool=pool,
                gpus=gpus,
                requested_at=moment,
                disk_node=disk_node,
                tenant=tenant,
            )
        return None

    def _demand_slowly(self, item: dict, label: str) -> Demand | None:
        demand_id = self.text(item, label, "id")
        group = self.text(item, label, "group")
        pool = self.text(item, label, "pool")
        gpus = self.integer(item, label, "gpus")
        requested_at = self.time(
            item.get("requested_at"), label, "requested_at", "requested_at" in item
        )
        disk_node = self.text(item, label, "disk_node", optional=True)
        tenant = self.text(item, label, "tenant", optional=True)
        if None in (demand_id, group, pool, gpus, requested_at):
            return None
        return Demand(
            id=demand_id,
            group=group,
            pool=pool,
            gpus=gpus,
            requested_at=requested_at,
            disk_node=disk_node,
            tenant=tenant,
        )

    def quota(self, item: dict, label: str) -> Quota | None:
        tenant = self.text(item, label, "tenant")
        pool = self.text(item, label, "pool", optional=True)
        max_gpus = self.integer(item, label, "max_gpus")
        if None in (tenant, max_gpus):
            return None
        return Quota(tenant=tenant, pool=pool, max_gpus=max_gpus)

    def reservation(self, item: dict, label: str) -> Reservation | None:
        reservation_id = self.text(item, label, "id")
        tenant = self.text(item, label, "tenant")
        gpus = self.integer(item, label, "gpus")
        block_gpus = self.integer(item, label, "block_gpus") if "block_gpus" in item else 1
        if None in (reservation_id, tenant, gpus, block_gpus):
            return None
        return Reservation(id=reservation_id, tenant=tenant, gpus=gpus, block_gpus=block_gpus)

    def text(self, item: dict, label: str, key: str, *, optional: bool = False) -> str | None:
        value = item.get(key)
        if type(value) is str:
            return value
        if value is None and (optional or key not in item):
            return None  # a missing required field is reported once, by _report_fields
        self.problems.append(f"{label}: {key} must be a string, got {_show(value)}")
        return None

    def integer(self, item: dict, label: str, key: str) -> int | None:
        value = item.get(key)
        if type(value) is int:
            return value
        if key not in item:
            return None
        self.problems.append(f"{label}: {key} must be an integer, got {_show(value)}")
        return None

    def indices(
        self, item: dict, label: str, key: str, *, optional: bool = False
    ) -> tuple[int, ...] | None:
        value = item.get(key)
        if value is None and optional:
            return ()
        if key not in item:
            return None
        if type(value) is list and all(type(index) is int for index in value):
            return tuple(value)
        self.problems.append(f"{label}: {key} must be a list of GPU indices, got {_show(value)}")
        return None

    def time(self, value: object, label: str, key: str, present: bool = True) -> datetime | None:
        if not present:
            return None
        if type(value) is str:
            moment = self._parse_time(value)
            if moment is not None:
                return moment
        self.problems.append(
            f"{label}: {key} must be an ISO 8601 time with a time zone "
            f'(e.g. "2026-11-29T10:00:00Z"), got {_show(value)}'
        )
        return None

    def _parse_time(self, value: str) -> datetime | None:
        """An aware datetime, or None when ``value`` is not an ISO 8601 time with a zone."""
        moment = self._times.get(value)
        if moment is None:
            try:
                moment = datetime.fromisoformat(value)
            except ValueError:
                return None
            if moment.tzinfo is None:
                return None
            self._times[value] = moment
        return moment
