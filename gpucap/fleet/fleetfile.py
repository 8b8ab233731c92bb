"""Fleet as code: one YAML file declares tenants, operators, clusters, nodes, capacity sets and
pools.

- ``fleet_file_load`` reads and validates a file and reports every problem at once, each naming
  the file, the item and the reason;
- ``fleet_file_apply`` brings the database to what the file says through the fleet services, in
  one transaction: all of it or nothing. It never deletes, and a second run changes nothing;
- ``fleet_file_export`` writes the database back in the same format.

The format is described in docs/fleet-file.md.
"""

import difflib
import json
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import yaml
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import check_password
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import Prefetch

from gpucap.arbiter.topology import partition_table_problems
from gpucap.audit.services import Actor
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import MAX_GPUS_PER_NODE, CapacitySet, Cluster, Fabric, Gpu, Node, Pool
from gpucap.roles import OPERATORS_GROUP
from gpucap.tenancy import services as tenancy
from gpucap.tenancy.models import Membership, Tenant

FORMAT_VERSION = 1


class FleetFileError(Exception):
    """A fleet file that cannot be applied. ``problems`` holds one line per problem, each
    starting with the file's path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


# --- what a file declares -----------------------------------------------------------------------
# ``where`` is the item's place in the file, e.g. "clusters[0].nodes[3] (h100-004)".


@dataclass(frozen=True)
class MemberSpec:
    where: str
    username: str
    email: str | None  # None: not declared, leave the user's email as it is
    role: str
    password: str | None


@dataclass(frozen=True)
class TenantSpec:
    where: str
    name: str
    slug: str
    members: tuple[MemberSpec, ...]


@dataclass(frozen=True)
class OperatorSpec:
    where: str
    username: str
    email: str | None
    password: str | None


@dataclass(frozen=True)
class ClusterSpec:
    where: str
    name: str
    driver: str
    driver_settings: dict


@dataclass(frozen=True)
class GpuSpec:
    index: int
    uuid: str | None = None
    pci_address: str | None = None
    health: str | None = None  # None: leave the card's health as it is


@dataclass(frozen=True)
class NodeSpec:
    where: str
    cluster: str
    hostname: str
    gpu_model: str
    fabric: str
    gpu_count: int
    capacity_set: str | None  # None: standalone
    state: str | None  # None: leave the node's state as it is (new nodes start ready)
    partitions: list | None  # None: the default table for the node's GPU count
    bmc_address: str
    labels: dict
    gpus: tuple[GpuSpec, ...]


@dataclass(frozen=True)
class CapacitySetSpec:
    where: str
    name: str
    cluster: str
    gpu_model: str
    fabric: str
    notice_seconds: int


@dataclass(frozen=True)
class PoolSpec:
    where: str
    name: str
    kind: str
    cluster: str
    capacity_set: str | None  # None: standalone on its cluster
    # The GPUs the pool rents. Required for a standalone pool; a pool in a set rents the set's
    # (None: not declared).
    gpu_model: str | None
    fabric: str | None
    rank: int
    floor_gpus: int
    tenants: tuple[str, ...]


@dataclass(frozen=True)
class FleetFile:
    source: str
    tenants: tuple[TenantSpec, ...] = ()
    operators: tuple[OperatorSpec, ...] = ()
    clusters: tuple[ClusterSpec, ...] = ()
    nodes: tuple[NodeSpec, ...] = ()
    capacity_sets: tuple[CapacitySetSpec, ...] = ()
    pools: tuple[PoolSpec, ...] = ()


@dataclass(frozen=True)
class Change:
    verb: str  # "create" or "update"
    noun: str
    label: str
    detail: str

    def line(self, *, dry_run: bool) -> str:
        verb = f"would {self.verb}" if dry_run else self.verb
        return f"{verb} {self.noun} {self.label}: {self.detail}"


_NOUNS = ("tenant", "user", "membership", "operator", "cluster", "capacity set", "node", "pool")


@dataclass(frozen=True)
class ApplyResult:
    changes: tuple[Change, ...]
    unchanged: int
    left_as_is: tuple[tuple[str, tuple[str, ...]], ...]  # (noun, labels)
    dry_run: bool

    def lines(self) -> list[str]:
        """One line per change, then what the database holds beyond the file."""
        lines = [change.line(dry_run=self.dry_run) for change in self.changes]
        for noun, labels in self.left_as_is:
            shown = ", ".join(labels[:10])
            if len(labels) > 10:
                shown += f" and {len(labels) - 10} more"
            lines.append(f"not in file (left as is): {_plural(len(labels), noun)}: {shown}")
        return lines

    def summary(self) -> str:
        """E.g. "created 3 nodes, updated 1 pool, unchanged 140"."""
        parts = []
        for verb in ("create", "update"):
            counts = dict.fromkeys(_NOUNS, 0)
            for change in self.changes:
                if change.verb == verb:
                    counts[change.noun] += 1
            counted = [_plural(n, noun) for noun, n in counts.items() if n]
            if counted:
                done = f"would {verb}" if self.dry_run else f"{verb}d"
                parts.append(f"{done} {_and_list(counted)}")
        if not parts:
            parts.append("nothing to change")
        parts.append(f"unchanged {self.unchanged}")
        summary = ", ".join(parts)
        return f"dry run, nothing written: {summary}" if self.dry_run else summary


# --- load and validate --------------------------------------------------------------------------


def fleet_file_load(path: str | Path) -> FleetFile:
    """Read and validate a fleet file. Raises FleetFileError listing every problem found."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise FleetFileError([f"{source}: cannot read the file: {exc.strerror}"]) from None
    except UnicodeDecodeError:
        raise FleetFileError([f"{source}: cannot read the file: it is not UTF-8 text"]) from None
    return fleet_file_parse(text, source=source)


def fleet_file_parse(text: str, *, source: str) -> FleetFile:
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = " ".join((exc.problem or exc.context or "unreadable").split())
        raise FleetFileError([f"{source}: {at}not valid YAML: {problem}"]) from None
    except yaml.YAMLError as exc:
        raise FleetFileError([f"{source}: not valid YAML: {exc}"]) from None
    problems: list[str] = []
    fleet_file = _Schema(source=source, problems=problems).read(raw)
    if problems:
        raise FleetFileError([f"{source}: {problem}" for problem in problems])
    return fleet_file


# --- apply --------------------------------------------------------------------------------------


def fleet_file_apply(
    fleet_file: FleetFile, *, dry_run: bool = False, actor: Actor = None
) -> ApplyResult:
    """Make the database hold what the file declares, through the fleet services, in one
    transaction. Nothing is deleted. Checks against the database come first and report every
    problem; a service that still refuses a step rolls the whole apply back. With ``dry_run``
    only the checks run and the result lists what would change."""
    with transaction.atomic():
        planner = _Planner(fleet_file, actor=actor)
        planner.plan()
        if planner.problems:
            raise FleetFileError([f"{fleet_file.source}: {p}" for p in planner.problems])
        if not dry_run:
            planner.run()
    return planner.result(dry_run=dry_run)


# --- export -------------------------------------------------------------------------------------

_EXPORT_HEADER = (
    "# gpucap fleet file (docs/fleet-file.md), written by `manage.py fleet_export`.\n"
    "# Apply with `manage.py fleet_apply FILE`. Passwords and capacity set modes are never\n"
    "# exported.\n"
)


def fleet_file_export() -> str:
    """The whole fleet in the fleet-file format, deterministic: the same database always gives
    the same text, and applying it to that database changes nothing."""
    document = {
        "version": FORMAT_VERSION,
        "tenants": _export_tenants(),
        "operators": _export_operators(),
        "clusters": _export_clusters(),
        "capacity_sets": _export_capacity_sets(),
        "pools": _export_pools(),
    }
    body = yaml.dump(
        document,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=4096,
        default_flow_style=False,
    )
    # A blank line before each top-level section, as a person would write it.
    body = "".join(
        f"\n{line}" if line[:1].isalpha() and not line.startswith("version") else line
        for line in body.splitlines(keepends=True)
    )
    return _EXPORT_HEADER + body


def _export_tenants() -> list:
    memberships = Membership.objects.select_related("user").order_by("user__username")
    tenants = Tenant.objects.order_by("slug").prefetch_related(
        Prefetch("memberships", queryset=memberships)
    )
    exported = []
    for tenant in tenants:
        entry: dict = {"name": tenant.name, "slug": tenant.slug}
        members = [
            _flow(
                _without_blanks(
                    {"username": m.user.username, "email": m.user.email, "role": m.role}
                )
            )
            for m in tenant.memberships.all()
        ]
        if members:
            entry["members"] = members
        exported.append(entry)
    return exported


def _export_operators() -> list:
    users = (
        get_user_model()
        .objects.filter(is_staff=True, groups__name=OPERATORS_GROUP)
        .order_by("username")
        .distinct()
    )
    return [_flow(_without_blanks({"username": u.username, "email": u.email})) for u in users]


def _export_clusters() -> list:
    nodes = Node.objects.select_related("capacity_set").order_by("hostname")
    clusters = Cluster.objects.order_by("name").prefetch_related(
        Prefetch("nodes", queryset=nodes),
        Prefetch("nodes__gpus", queryset=Gpu.objects.order_by("index")),
    )
    exported = []
    for cluster in clusters:
        entry: dict = {"name": cluster.name, "driver": cluster.driver}
        if cluster.driver_settings:
            entry["driver_settings"] = _sorted_json(cluster.driver_settings)
        entry["nodes"] = [_export_node(cluster, node) for node in cluster.nodes.all()]
        exported.append(entry)
    return exported


def _export_node(cluster: Cluster, node: Node) -> dict:
    entry: dict = {
        "hostname": node.hostname,
        "gpu_model": node.gpu_model,
        "fabric": node.fabric,
        "gpus": node.gpu_count,
    }
    if node.capacity_set is not None:
        entry["capacity_set"] = node.capacity_set.name
    if node.state != Node.State.READY:
        entry["state"] = node.state
    if node.bmc_address:
        entry["bmc_address"] = node.bmc_address
    if node.labels:
        entry["labels"] = _flow(dict(sorted(node.labels.items())))
    if node.partitions:
        entry["partitions"] = _flow([_flow(block) for block in node.partitions])
    # Only what differs from the generated card is written, so counts stay the whole story for
    # an ordinary node.
    gpu_list = []
    for gpu in node.gpus.all():
        generated = fleet.generated_gpu(cluster=cluster, hostname=node.hostname, index=gpu.index)
        listed: dict = {}
        if gpu.uuid != generated["uuid"]:
            listed["uuid"] = gpu.uuid
        if gpu.pci_address != generated["pci_address"]:
            listed["pci_address"] = gpu.pci_address
        if gpu.health != Gpu.Health.OK:
            listed["health"] = gpu.health
        if listed:
            gpu_list.append(_flow({"index": gpu.index, **listed}))
    if gpu_list:
        entry["gpu_list"] = gpu_list
    return entry


def _export_capacity_sets() -> list:
    return [
        {
            "name": s.name,
            "cluster": s.cluster.name,
            "gpu_model": s.gpu_model,
            "fabric": s.fabric,
            "notice_seconds": s.notice_seconds,
        }
        for s in CapacitySet.objects.select_related("cluster").order_by("name")
    ]


def _export_pools() -> list:
    pools = Pool.objects.select_related("cluster", "capacity_set").prefetch_related(
        Prefetch("tenants", queryset=Tenant.objects.order_by("slug"))
    )

    def order(pool: Pool) -> tuple:
        in_set = pool.capacity_set is not None
        return (pool.cluster.name, not in_set, pool.capacity_set.name if in_set else "", pool.rank)

    exported = []
    for pool in sorted(pools, key=order):
        entry: dict = {"name": pool.name, "kind": pool.kind, "cluster": pool.cluster.name}
        if pool.capacity_set is not None:
            entry["capacity_set"] = pool.capacity_set.name
        else:  # a set's pools rent the set's GPUs; only a standalone pool names its own
            entry["gpu_model"] = pool.gpu_model
            entry["fabric"] = pool.fabric
        entry["rank"] = pool.rank
        entry["floor_gpus"] = pool.floor_gpus
        slugs = [t.slug for t in pool.tenants.all()]
        if slugs:
            entry["tenants"] = _flow(slugs)
        exported.append(entry)
    return exported


def _without_blanks(entry: dict) -> dict:
    return {key: value for key, value in entry.items() if value not in ("", None)}


def _sorted_json(value: object) -> object:
    if isinstance(value, dict):
        return {key: _sorted_json(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted_json(item) for item in value]
    return value


def _flow(value: dict | list) -> dict | list:
    """Mark a list or mapping to be written on one line: ``[0, 2]``, ``{rack: r12}``."""
    return _FlowDict(value) if isinstance(value, dict) else _FlowList(value)


class _FlowList(list):
    pass


class _FlowDict(dict):
    pass


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False):
        # Indent list items under their key, as people write YAML by hand.
        return super().increase_indent(flow, False)

    def ignore_aliases(self, data: object) -> bool:
        return True


_Dumper.add_representer(
    _FlowList,
    lambda dumper, value: dumper.represent_sequence(
        "tag:yaml.org,2002:seq", value, flow_style=True
    ),
)
_Dumper.add_representer(
    _FlowDict,
    lambda dumper, value: dumper.represent_mapping(
        "tag:yaml.org,2002:map", value.items(), flow_style=True
    ),
)


# --- reading the file -------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping (PyYAML keeps the last one
    silently, which hides typos as surely as an unknown key would)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # keys merged in with << may be overridden; that is what merging is for
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, str | int | float | bool) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

_TOP_KEYS = ("version", "tenants", "operators", "clusters", "capacity_sets", "pools")
_TENANT_KEYS = ("name", "slug", "members")
_MEMBER_KEYS = ("username", "email", "role", "password")
_OPERATOR_KEYS = ("username", "email", "password")
_CLUSTER_KEYS = ("name", "driver", "driver_settings", "nodes")
_NODE_KEYS = (
    "hostname",
    "count",
    "start",
    "gpu_model",
    "fabric",
    "gpus",
    "capacity_set",
    "state",
    "bmc_address",
    "labels",
    "partitions",
    "gpu_list",
)
_GPU_KEYS = ("index", "uuid", "pci_address", "health")
_CAPACITY_SET_KEYS = ("name", "cluster", "gpu_model", "fabric", "notice_seconds", "mode")
_POOL_KEYS = (
    "name",
    "kind",
    "cluster",
    "capacity_set",
    "gpu_model",
    "fabric",
    "rank",
    "floor_gpus",
    "tenants",
)

_SLUG = r"^[-a-zA-Z0-9_]+$"
_SLUG_HINT = "letters, digits, - and _"
_USERNAME = r"^[\w.@+-]+$"
_HOSTNAME = r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$"
_PCI_ADDRESS = r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$"
_MAX_COUNT = 1000


class _Schema:
    """Turns the parsed YAML into specs, collecting every problem instead of stopping at the
    first, so one run shows all of a file's mistakes."""

    def __init__(self, *, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        self._first: dict[tuple, str] = {}
        self._rank_holders: dict[tuple, str] = {}

    def read(self, raw: object) -> FleetFile:
        top = _Fields({} if raw is None else raw, where="", keys=_TOP_KEYS, problems=self.problems)
        version = top.integer("version", default=FORMAT_VERSION)
        if version is not None and version != FORMAT_VERSION:
            top.problem(
                "version", f"this gpucap reads version {FORMAT_VERSION} files, got {version}"
            )
        tenants = [self._tenant(i, item) for i, item in enumerate(top.sequence("tenants"))]
        operators = [self._operator(i, item) for i, item in enumerate(top.sequence("operators"))]
        clusters, nodes = [], []
        for i, item in enumerate(top.sequence("clusters")):
            cluster, cluster_nodes = self._cluster(i, item)
            clusters.append(cluster)
            nodes.extend(cluster_nodes)
        capacity_sets = [
            self._capacity_set(i, item) for i, item in enumerate(top.sequence("capacity_sets"))
        ]
        pools = [self._pool(i, item) for i, item in enumerate(top.sequence("pools"))]
        self._check_users(tenants, operators)
        return FleetFile(
            source=self.source,
            tenants=tuple(t for t in tenants if t),
            operators=tuple(o for o in operators if o),
            clusters=tuple(c for c in clusters if c),
            nodes=tuple(nodes),
            capacity_sets=tuple(s for s in capacity_sets if s),
            pools=tuple(p for p in pools if p),
        )

    def _fields(self, raw: object, path: str, name_key: str, keys: tuple[str, ...]) -> "_Fields":
        return _Fields(raw, where=_label(path, raw, name_key), keys=keys, problems=self.problems)

    def _unique(
        self, fields: "_Fields", kind: str, key: str, value: object, scope: str = ""
    ) -> None:
        first = self._first.setdefault((kind, scope, value), fields.where)
        if first != fields.where:
            fields.problem(key, f"{value} is declared twice (first at {first})")

    # tenants and people

    def _tenant(self, i: int, raw: object) -> TenantSpec | None:
        f = self._fields(raw, f"tenants[{i}]", "slug", _TENANT_KEYS)
        name = f.text("name", required=True, max_length=200)
        slug = f.slug("slug", required=True)
        if slug:
            self._unique(f, "tenant", "slug", slug)
        if name:
            self._unique(f, "tenant name", "name", name)
        members = []
        for j, item in enumerate(f.sequence("members")):
            m = self._fields(item, f"tenants[{i}].members[{j}]", "username", _MEMBER_KEYS)
            username = m.username("username")
            if username:
                self._unique(m, "member", "username", username, scope=f"tenants[{i}]")
            member = MemberSpec(
                where=m.where,
                username=username,
                email=m.email("email"),
                role=m.choice("role", Membership.Role.values, default=Membership.Role.MEMBER),
                password=m.text("password", max_length=128),
            )
            if m.clean:
                members.append(member)
            else:
                f.clean = False
        if not f.clean:
            return None
        return TenantSpec(where=f.where, name=name, slug=slug, members=tuple(members))

    def _operator(self, i: int, raw: object) -> OperatorSpec | None:
        f = self._fields(raw, f"operators[{i}]", "username", _OPERATOR_KEYS)
        username = f.username("username")
        if username:
            self._unique(f, "operator", "username", username)
        spec = OperatorSpec(
            where=f.where,
            username=username,
            email=f.email("email"),
            password=f.text("password", max_length=128),
        )
        return spec if f.clean else None

    def _check_users(self, tenants: list, operators: list) -> None:
        """One user may be declared in several places (two tenants, or a member who is also an
        operator); the places must agree on the email and password."""
        declared: dict[str, MemberSpec | OperatorSpec] = {}
        people = [m for t in tenants if t for m in t.members] + [o for o in operators if o]
        for person in people:
            first = declared.setdefault(person.username, person)
            for field in ("email", "password"):
                mine, theirs = getattr(person, field), getattr(first, field)
                if mine is not None and theirs is not None and mine != theirs:
                    self.problems.append(
                        f"{person.where}: {field}: differs from the {field} given for the same "
                        f"user at {first.where}"
                    )
            if first.email is None and person.email is not None:
                declared[person.username] = person

    # clusters and nodes

    def _cluster(self, i: int, raw: object) -> tuple[ClusterSpec | None, list[NodeSpec]]:
        f = self._fields(raw, f"clusters[{i}]", "name", _CLUSTER_KEYS)
        name = f.slug("name", required=True)
        if name:
            self._unique(f, "cluster", "name", name)
        driver = f.choice("driver", Cluster.Driver.values, default=Cluster.Driver.SIMULATED)
        driver_settings = f.mapping("driver_settings")
        nodes = []
        for j, item in enumerate(f.sequence("nodes")):
            nodes.extend(self._nodes(name, f"clusters[{i}].nodes[{j}]", item))
        if not f.clean:
            return None, nodes
        spec = ClusterSpec(
            where=f.where, name=name, driver=driver, driver_settings=driver_settings or {}
        )
        return spec, nodes

    def _nodes(self, cluster: str | None, path: str, raw: object) -> list[NodeSpec]:
        """One entry of a cluster's node list: a single node, or ``count`` identical nodes
        whose hostname (and BMC address) is a pattern such as ``h100-{:03d}``."""
        where = _label(path, raw, "hostname")
        if isinstance(raw, dict) and "count" in raw:
            where = f"{where[:-1]}, count {raw['count']})" if where.endswith(")") else where
        f = _Fields(raw, where=where, keys=_NODE_KEYS, problems=self.problems)
        count = f.integer("count", low=1, high=_MAX_COUNT)
        start = f.integer("start", low=0, default=1)
        if "start" in f.raw and "count" not in f.raw:
            f.problem("start", "goes with count; a single node has no number")
        pattern = f.text("hostname", required=True, max_length=253)
        gpu_model = f.text("gpu_model", required=True, max_length=64)
        fabric = f.choice("fabric", Fabric.values, required=True)
        gpu_count = f.integer("gpus", required=True, low=1, high=MAX_GPUS_PER_NODE)
        capacity_set = f.slug("capacity_set")
        state = f.choice("state", Node.State.values)
        bmc_pattern = f.text("bmc_address", default="", max_length=253)
        labels = f.labels("labels")
        partitions = self._partitions(f, fabric, gpu_count)
        gpus = self._gpu_list(f, gpu_count, count)
        numbered = self._hostnames(f, pattern, count, start)
        bmc = self._bmc_addresses(f, bmc_pattern, numbered, counted=count is not None)
        if not f.clean or cluster is None:
            return []
        specs = []
        for (_, hostname), bmc_address in zip(numbered, bmc, strict=True):
            spec = NodeSpec(
                where=f"{path} ({hostname})",
                cluster=cluster,
                hostname=hostname,
                gpu_model=gpu_model,
                fabric=fabric,
                gpu_count=gpu_count,
                capacity_set=capacity_set,
                state=state,
                partitions=partitions,
                bmc_address=bmc_address,
                labels=labels or {},
                gpus=gpus,
            )
            first = self._first.setdefault(("node", cluster, hostname), spec.where)
            if first != spec.where:
                self.problems.append(
                    f"{spec.where}: hostname: {hostname} is declared twice in cluster {cluster} "
                    f"(first at {first})"
                )
            specs.append(spec)
        return specs

    def _partitions(self, f: "_Fields", fabric: str | None, gpu_count: int | None) -> list | None:
        partitions = f.raw.get("partitions")
        if partitions is None:
            return None
        if fabric == Fabric.PCIE:
            f.problem(
                "partitions", "only NVSwitch nodes carry a partition table; this node is pcie"
            )
        elif gpu_count is not None:
            for problem in partition_table_problems(partitions, gpu_count):
                f.problem("partitions", problem)
        return partitions

    def _gpu_list(
        self, f: "_Fields", gpu_count: int | None, count: int | None
    ) -> tuple[GpuSpec, ...]:
        gpus = []
        seen = set()
        for k, item in enumerate(f.sequence("gpu_list")):
            g = _Fields(
                item, where=f"{f.where}: gpu_list[{k}]", keys=_GPU_KEYS, problems=self.problems
            )
            index = g.integer(
                "index", required=True, low=0, high=(gpu_count or MAX_GPUS_PER_NODE) - 1
            )
            if index is not None and index in seen:
                g.problem("index", f"GPU {index} is listed twice")
            seen.add(index)
            uuid = g.text("uuid", max_length=64)
            if uuid and count is not None and count > 1:
                g.problem("uuid", f"a UUID names one card; it cannot be given to {count} nodes")
            gpu = GpuSpec(
                index=index,
                uuid=uuid,
                pci_address=g.text(
                    "pci_address",
                    max_length=16,
                    pattern=_PCI_ADDRESS,
                    hint="like 0000:18:00.0, lower-case hex",
                ),
                health=g.choice("health", Gpu.Health.values),
            )
            if g.clean:
                gpus.append(gpu)
            else:
                f.clean = False
        return tuple(gpus)

    def _hostnames(
        self, f: "_Fields", pattern: str | None, count: int | None, start: int | None
    ) -> list[tuple[int | None, str]]:
        if pattern is None:
            return []
        if count is None:
            if "{" in pattern or "}" in pattern:
                f.problem("hostname", f"{pattern!r} is a pattern; give count (and start) with it")
                return []
            numbered: list[tuple[int | None, str]] = [(None, pattern)]
        else:
            first = start if start is not None else 1
            try:
                numbered = [(n, pattern.format(n)) for n in range(first, first + count)]
            except (ValueError, IndexError, KeyError) as exc:
                f.problem(
                    "hostname",
                    f"{pattern!r} is not a pattern with one number field, such "
                    f"as h100-{{:03d}} ({exc})",
                )
                return []
            if len({hostname for _, hostname in numbered}) != count:
                f.problem(
                    "hostname",
                    f"{pattern!r} gives the {count} nodes the same name; put a "
                    "number field such as {:03d} in it",
                )
                return []
        for _, hostname in numbered:
            if not _matches(_HOSTNAME, hostname):
                f.problem(
                    "hostname",
                    f"{hostname!r} is not a hostname (letters, digits, dots and hyphens)",
                )
                return []
        return numbered

    def _bmc_addresses(
        self, f: "_Fields", pattern: str | None, numbered: list, *, counted: bool
    ) -> list[str]:
        pattern = pattern or ""
        if not counted or "{" not in pattern:
            return [pattern] * len(numbered)
        try:
            return [pattern.format(n) for n, _ in numbered]
        except (ValueError, IndexError, KeyError) as exc:
            f.problem("bmc_address", f"{pattern!r} is not a pattern with one number field ({exc})")
            return [pattern] * len(numbered)

    # capacity sets and pools

    def _capacity_set(self, i: int, raw: object) -> CapacitySetSpec | None:
        f = self._fields(raw, f"capacity_sets[{i}]", "name", _CAPACITY_SET_KEYS)
        name = f.slug("name", required=True)
        if name:
            self._unique(f, "capacity set", "name", name)
        if "mode" in f.raw:
            f.problem(
                "mode",
                "cannot be set from a fleet file: a new set starts in dry_run and an "
                "operator enables enforcement on the set's page",
            )
        spec = CapacitySetSpec(
            where=f.where,
            name=name,
            cluster=f.slug("cluster", required=True),
            gpu_model=f.text("gpu_model", required=True, max_length=64),
            fabric=f.choice("fabric", Fabric.values, required=True),
            notice_seconds=f.integer("notice_seconds", default=120, low=1, high=86400),
        )
        return spec if f.clean else None

    def _pool(self, i: int, raw: object) -> PoolSpec | None:
        f = self._fields(raw, f"pools[{i}]", "name", _POOL_KEYS)
        name = f.slug("name", required=True)
        if name:
            self._unique(f, "pool", "name", name)
        tenants = []
        for k, slug in enumerate(f.sequence("tenants")):
            if not isinstance(slug, str) or not _matches(_SLUG, slug):
                f.problem(f"tenants[{k}]", f"must be a tenant slug, got {_shown(slug)}")
            elif slug in tenants:
                f.problem(f"tenants[{k}]", f"{slug} is listed twice")
            else:
                tenants.append(slug)
        spec = PoolSpec(
            where=f.where,
            name=name,
            kind=f.choice("kind", Pool.Kind.values, required=True),
            cluster=f.slug("cluster", required=True),
            capacity_set=f.slug("capacity_set"),
            gpu_model=f.text("gpu_model", max_length=64),
            fabric=f.choice("fabric", Fabric.values),
            rank=f.integer("rank", required=True, low=1),
            floor_gpus=f.integer("floor_gpus", default=0, low=0),
            tenants=tuple(sorted(tenants)),
        )
        if spec.cluster and spec.rank:
            self._check_rank(f, spec)
        if spec.capacity_set is None:
            # A set's pools rent the set's GPUs; a standalone pool says which of its cluster's
            # standalone nodes it places on.
            for key in ("gpu_model", "fabric"):
                if f.raw.get(key) is None:
                    f.problem(
                        key,
                        "is required for a standalone pool: the "
                        + ("GPU model" if key == "gpu_model" else "fabric (pcie or nvswitch)")
                        + " of the cluster's standalone nodes it places on",
                    )
        return spec if f.clean else None

    def _check_rank(self, f: "_Fields", spec: PoolSpec) -> None:
        """Ranks are unique within a set, and among a cluster's standalone pools."""
        key = (spec.cluster, spec.capacity_set, spec.rank)
        first = self._rank_holders.setdefault(key, f.where)
        if first != f.where:
            f.problem(
                "rank",
                f"{spec.rank} is also the rank of {first} among "
                f"{_group_text(spec.cluster, spec.capacity_set)}; ranks are unique there",
            )


class _Fields:
    """One mapping of the file, read key by key. Problems are collected, never raised; ``clean``
    says whether this mapping had none."""

    def __init__(self, raw: object, *, where: str, keys: tuple[str, ...], problems: list[str]):
        self.where = where
        self.problems = problems
        self.clean = True
        self.raw = raw if isinstance(raw, dict) else {}
        if not isinstance(raw, dict):
            self._add(f"must be a mapping of keys to values, got {_shown(raw)}")
        for key in self.raw:
            if key not in keys:
                self.problem(str(key), _unknown_key(str(key), keys))

    def _add(self, text: str) -> None:
        self.clean = False
        self.problems.append(f"{self.where}: {text}" if self.where else text)

    def problem(self, key: str, reason: str) -> None:
        self._add(f"{key}: {reason}")

    def _get(self, key: str, required: bool) -> object:
        value = self.raw.get(key)
        if value is None and required:
            self.problem(key, "is required")
        return value

    def text(
        self,
        key: str,
        *,
        required: bool = False,
        default: str | None = None,
        max_length: int = 253,
        pattern: str | None = None,
        hint: str = "",
    ) -> str | None:
        value = self._get(key, required)
        if value is None:
            return default
        if not isinstance(value, str) or not value.strip():
            quote = f'; quote it: {key}: "{value}"' if isinstance(value, int | float) else ""
            self.problem(key, f"must be text, got {_shown(value)}{quote}")
            return default
        if len(value) > max_length:
            self.problem(key, f"must be at most {max_length} characters, got {len(value)}")
        elif pattern and not _matches(pattern, value):
            self.problem(key, f"{value!r} may contain only {hint}")
        return value

    def slug(self, key: str, *, required: bool = False) -> str | None:
        return self.text(key, required=required, max_length=64, pattern=_SLUG, hint=_SLUG_HINT)

    def username(self, key: str) -> str | None:
        return self.text(
            key, required=True, max_length=150, pattern=_USERNAME, hint="letters, digits, @.+-_"
        )

    def integer(
        self,
        key: str,
        *,
        required: bool = False,
        default: int | None = None,
        low: int | None = None,
        high: int | None = None,
    ) -> int | None:
        value = self._get(key, required)
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool):
            self.problem(key, f"must be a whole number, got {_shown(value)}")
            return default
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"{low}..{high}" if high is not None else f"at least {low}"
            self.problem(key, f"must be {bounds}, got {value}")
            return default
        return value

    def choice(
        self, key: str, choices: list[str], *, required: bool = False, default: str | None = None
    ) -> str | None:
        value = self._get(key, required)
        if value is None:
            return default
        if value not in choices:
            self.problem(key, f"must be one of {', '.join(choices)}; got {_shown(value)}")
            return default
        return value

    def email(self, key: str) -> str | None:
        value = self.text(key, max_length=254)
        if value:
            try:
                validate_email(value)
            except ValidationError:
                self.problem(key, f"{value!r} is not an email address")
        return value

    def mapping(self, key: str) -> dict | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            self.problem(key, f"must be a mapping with text keys, got {_shown(value)}")
            return None
        return value

    def labels(self, key: str) -> dict | None:
        value = self.mapping(key)
        if value is None:
            return None
        for name, text in value.items():
            if not isinstance(text, str):
                self.problem(key, f'the value of {name} must be text; quote it: {name}: "{text}"')
        return value

    def sequence(self, key: str) -> list:
        value = self.raw.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.problem(key, f"must be a list (lines starting with -), got {_shown(value)}")
            return []
        return value


def _label(path: str, raw: object, name_key: str) -> str:
    name = raw.get(name_key) if isinstance(raw, dict) else None
    return f"{path} ({name})" if isinstance(name, str | int) and name != "" else path


def _unknown_key(key: str, keys: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, keys, n=1)
    if close:
        return f"unknown key; did you mean {close[0]}?"
    return f"unknown key; expected one of {', '.join(keys)}"


def _shown(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _matches(pattern: str, value: str) -> bool:
    return re.match(pattern, value) is not None


# --- planning an apply ------------------------------------------------------------------------

# The order steps run in. Floors come down before nodes leave sets and go up after nodes join
# them; nodes join a set before others leave it; pools are created before they are re-ranked.
_PHASES = (
    "users",
    "tenants",
    "memberships",
    "operators",
    "clusters",
    "capacity_sets",
    "floors_down",
    "nodes",
    "joins",
    "leaves",
    "moves",
    "pools",
    "ranks",
    "floors_up",
    "pool_tenants",
)


class _Planner:
    """Compares the file with the database: finds the problems, the changes and the service
    calls that make them, in a safe order."""

    def __init__(self, fleet_file: FleetFile, *, actor: Actor) -> None:
        self.file = fleet_file
        self.actor = actor
        self.problems: list[str] = []
        self.changes: list[Change] = []
        self.unchanged = 0
        self.steps: dict[str, list[tuple[str, Callable[[], object]]]] = {p: [] for p in _PHASES}
        self._load()

    def _load(self) -> None:
        users = get_user_model().objects
        usernames = {m.username for t in self.file.tenants for m in t.members}
        usernames |= {o.username for o in self.file.operators}
        self.users = {u.username: u for u in users.filter(username__in=usernames)}
        self.operators = set(
            users.filter(is_staff=True, groups__name=OPERATORS_GROUP).values_list(
                "username", flat=True
            )
        )
        self.tenants = {t.slug: t for t in Tenant.objects.all()}
        self.memberships = {
            (m.tenant.slug, m.user.username): m
            for m in Membership.objects.select_related("tenant", "user")
        }
        self.clusters = {c.name: c for c in Cluster.objects.all()}
        self.sets = {s.name: s for s in CapacitySet.objects.select_related("cluster")}
        self.nodes = {
            (n.cluster.name, n.hostname): n
            for n in Node.objects.select_related("cluster", "capacity_set").prefetch_related("gpus")
        }
        self.pools = {
            p.name: p
            for p in Pool.objects.select_related("cluster", "capacity_set").prefetch_related(
                "tenants"
            )
        }

    # bookkeeping

    def _problem(self, where: str, text: str) -> None:
        self.problems.append(f"{where}: {text}")

    def _change(self, verb: str, noun: str, label: str, details: list[str] | str) -> None:
        detail = details if isinstance(details, str) else "; ".join(details)
        self.changes.append(Change(verb=verb, noun=noun, label=label, detail=detail))

    def _step(self, phase: str, where: str, service: Callable, **kwargs: object) -> None:
        """Schedule ``service(**kwargs, actor=...)`` to run in ``phase``."""
        self.steps[phase].append((where, partial(service, actor=self.actor, **kwargs)))

    def plan(self) -> None:
        self._plan_people()
        self._plan_clusters()
        self._plan_capacity_sets()
        self._plan_nodes()
        self._plan_pools()
        self._check_floors()

    def run(self) -> None:
        source = self.file.source
        for phase in _PHASES:
            for where, call in self.steps[phase]:
                try:
                    call()
                except ValidationError as exc:
                    raise FleetFileError(
                        [f"{source}: {where}: {text}" for text in _validation_messages(exc)]
                    ) from None
                except Conflict as exc:
                    raise FleetFileError([f"{source}: {where}: {exc.message}"]) from None
                except IntegrityError as exc:
                    first_line = str(exc).splitlines()[0] if str(exc) else "integrity error"
                    raise FleetFileError(
                        [f"{source}: {where}: the database refused the change: {first_line}"]
                    ) from None

    def result(self, *, dry_run: bool) -> ApplyResult:
        return ApplyResult(
            changes=tuple(self.changes),
            unchanged=self.unchanged,
            left_as_is=tuple(
                (noun, tuple(labels)) for noun, labels in self._left_as_is() if labels
            ),
            dry_run=dry_run,
        )

    # people

    def _plan_people(self) -> None:
        declared: dict[str, MemberSpec | OperatorSpec] = {}
        passwords: dict[str, str] = {}
        for person in [m for t in self.file.tenants for m in t.members] + list(self.file.operators):
            first = declared.setdefault(person.username, person)
            if first.email is None and person.email is not None:
                declared[person.username] = person
            if person.password is not None:
                passwords.setdefault(person.username, person.password)
        for username, person in declared.items():
            self._plan_user(person, passwords.get(username))
        for tenant in self.file.tenants:
            self._plan_tenant(tenant)
        for operator in self.file.operators:
            if operator.username in self.operators:
                self.unchanged += 1
                continue
            self._change("create", "operator", operator.username, "staff in group operators")
            self._step(
                "operators", operator.where, operator_grant_by_name, username=operator.username
            )

    def _plan_user(self, person: MemberSpec | OperatorSpec, password: str | None) -> None:
        user = self.users.get(person.username)
        if user is None:
            self._change("create", "user", person.username, person.email or "no email")
            self._step(
                "users",
                person.where,
                tenancy.user_create,
                username=person.username,
                email=person.email or "",
                password=password,
            )
            return
        details = []
        email = None
        if person.email is not None and person.email != user.email:
            details.append(f"email {user.email or '(none)'} -> {person.email}")
            email = person.email
        if password is not None and not check_password(password, user.password):
            details.append("password set from the file")
        else:
            password = None
        if not details:
            self.unchanged += 1
            return
        self._change("update", "user", person.username, details)
        self._step(
            "users", person.where, tenancy.user_update, user=user, email=email, password=password
        )

    def _plan_tenant(self, spec: TenantSpec) -> None:
        tenant = self.tenants.get(spec.slug)
        if tenant is None:
            self._change("create", "tenant", spec.slug, spec.name)
            self._step("tenants", spec.where, tenancy.tenant_create, name=spec.name, slug=spec.slug)
        elif tenant.name != spec.name:
            self._change("update", "tenant", spec.slug, f"name {tenant.name} -> {spec.name}")
            self._step("tenants", spec.where, tenancy.tenant_rename, tenant=tenant, name=spec.name)
        else:
            self.unchanged += 1
        for member in spec.members:
            label = f"{spec.slug}/{member.username}"
            membership = self.memberships.get((spec.slug, member.username))
            if membership is not None and membership.role == member.role:
                self.unchanged += 1
                continue
            if membership is None:
                self._change("create", "membership", label, member.role)
            else:
                self._change(
                    "update", "membership", label, f"role {membership.role} -> {member.role}"
                )
            self._step(
                "memberships",
                member.where,
                membership_set_by_name,
                username=member.username,
                slug=spec.slug,
                role=member.role,
            )

    # clusters and capacity sets

    def _plan_clusters(self) -> None:
        for spec in self.file.clusters:
            cluster = self.clusters.get(spec.name)
            if cluster is None:
                self._change("create", "cluster", spec.name, f"driver {spec.driver}")
                self._step(
                    "clusters",
                    spec.where,
                    fleet.cluster_create,
                    name=spec.name,
                    driver=spec.driver,
                    driver_settings=spec.driver_settings,
                )
                continue
            details = []
            if cluster.driver != spec.driver:
                details.append(f"driver {cluster.driver} -> {spec.driver}")
            if cluster.driver_settings != spec.driver_settings:
                details.append(
                    f"driver_settings {_compact(cluster.driver_settings)} -> "
                    f"{_compact(spec.driver_settings)}"
                )
            if not details:
                self.unchanged += 1
                continue
            self._change("update", "cluster", spec.name, details)
            self._step(
                "clusters",
                spec.where,
                fleet.cluster_update,
                cluster=cluster,
                driver=spec.driver,
                driver_settings=spec.driver_settings,
            )

    def _cluster_known(self, name: str) -> bool:
        return name in self.clusters or any(c.name == name for c in self.file.clusters)

    def _set_facts(self, name: str) -> tuple[str, str, str] | None:
        """(cluster, GPU model, fabric) of a set, as it will be once the file is applied."""
        for spec in self.file.capacity_sets:
            if spec.name == name:
                return spec.cluster, spec.gpu_model, spec.fabric
        capacity_set = self.sets.get(name)
        if capacity_set is None:
            return None
        return capacity_set.cluster.name, capacity_set.gpu_model, capacity_set.fabric

    def _plan_capacity_sets(self) -> None:
        for spec in self.file.capacity_sets:
            if not self._cluster_known(spec.cluster):
                self._problem(
                    spec.where,
                    f"cluster: no cluster named {spec.cluster} in the file or the database",
                )
            capacity_set = self.sets.get(spec.name)
            if capacity_set is None:
                self._change(
                    "create",
                    "capacity set",
                    spec.name,
                    f"{spec.gpu_model} {spec.fabric} in {spec.cluster}, notice "
                    f"{spec.notice_seconds} s, starts in dry_run",
                )
                self._step("capacity_sets", spec.where, _capacity_set_create, spec=spec)
                continue
            now = {
                "cluster": capacity_set.cluster.name,
                "gpu_model": capacity_set.gpu_model,
                "fabric": capacity_set.fabric,
            }
            for field, value in now.items():
                wanted = getattr(spec, field)
                if wanted != value:
                    self._problem(spec.where, _fixed_field(field, spec.name, value, wanted, "set"))
            if capacity_set.notice_seconds == spec.notice_seconds:
                self.unchanged += 1
                continue
            self._change(
                "update",
                "capacity set",
                spec.name,
                f"notice_seconds {capacity_set.notice_seconds} -> {spec.notice_seconds}",
            )
            self._step(
                "capacity_sets",
                spec.where,
                fleet.capacity_set_update,
                capacity_set=capacity_set,
                notice_seconds=spec.notice_seconds,
            )

    # nodes

    def _plan_nodes(self) -> None:
        for spec in self.file.nodes:
            self._check_node_set(spec)
            node = self.nodes.get((spec.cluster, spec.hostname))
            if node is None:
                self._plan_new_node(spec)
            else:
                self._plan_existing_node(spec, node)

    def _check_node_set(self, spec: NodeSpec) -> None:
        if spec.capacity_set is None:
            return
        facts = self._set_facts(spec.capacity_set)
        if facts is None:
            self._problem(
                spec.where,
                f"capacity_set: no capacity set named {spec.capacity_set} "
                "in the file or the database",
            )
            return
        cluster, gpu_model, fabric = facts
        mismatches = []
        if spec.cluster != cluster:
            mismatches.append(f"cluster {spec.cluster} is not the set's cluster {cluster}")
        if spec.gpu_model != gpu_model:
            mismatches.append(f"GPU model {spec.gpu_model} is not the set's {gpu_model}")
        if spec.fabric != fabric:
            mismatches.append(f"fabric {spec.fabric} is not the set's {fabric}")
        if mismatches:
            self._problem(
                spec.where,
                f"capacity_set: node {spec.hostname} cannot join {spec.capacity_set}: "
                + "; ".join(mismatches),
            )

    def _plan_new_node(self, spec: NodeSpec) -> None:
        what = f"{spec.gpu_count} x {spec.gpu_model} {spec.fabric}"
        where_to = f"set {spec.capacity_set}" if spec.capacity_set else "standalone"
        extra = [f"state {spec.state}"] if spec.state not in (None, Node.State.READY) else []
        self._change("create", "node", _node_label(spec), ", ".join([what, where_to, *extra]))
        self._step("nodes", spec.where, _node_create, spec=spec)
        if spec.capacity_set:
            self._step(
                "joins",
                spec.where,
                _node_join,
                cluster=spec.cluster,
                hostname=spec.hostname,
                capacity_set=spec.capacity_set,
            )

    def _plan_existing_node(self, spec: NodeSpec, node: Node) -> None:
        for field, value, wanted in (
            ("gpu_model", node.gpu_model, spec.gpu_model),
            ("fabric", node.fabric, spec.fabric),
            ("gpus", node.gpu_count, spec.gpu_count),
        ):
            if value != wanted:
                self._problem(spec.where, _fixed_field(field, node.hostname, value, wanted, "node"))
        details = []
        described = self._plan_node_update(spec, node)
        details.extend(described)
        if spec.state is not None and spec.state != node.state:
            details.append(f"state {node.state} -> {spec.state}")
            self._step("nodes", spec.where, _node_set_state, node=node, state=spec.state)
        details.extend(self._plan_gpus(spec, node))
        current_set = node.capacity_set.name if node.capacity_set else None
        if current_set != spec.capacity_set:
            details.append(
                f"capacity set {current_set or 'none (standalone)'} -> "
                f"{spec.capacity_set or 'none (standalone)'}"
            )
            if current_set is not None:
                self._step("leaves", spec.where, fleet.node_leave_set, node=node)
            if spec.capacity_set is not None:
                self._step(
                    "joins" if current_set is None else "moves",
                    spec.where,
                    _node_join,
                    cluster=spec.cluster,
                    hostname=spec.hostname,
                    capacity_set=spec.capacity_set,
                )
        if details:
            self._change("update", "node", _node_label(spec), details)
        else:
            self.unchanged += 1

    def _plan_node_update(self, spec: NodeSpec, node: Node) -> list[str]:
        details = []
        changes: dict = {}
        if (node.partitions or None) != (spec.partitions or None):
            details.append(
                f"partitions {_table_text(node.partitions)} -> {_table_text(spec.partitions)}"
            )
            changes["partitions"] = spec.partitions
        if node.bmc_address != spec.bmc_address:
            details.append(
                f"bmc_address {node.bmc_address or '(none)'} -> {spec.bmc_address or '(none)'}"
            )
            changes["bmc_address"] = spec.bmc_address
        if node.labels != spec.labels:
            details.append(f"labels {_compact(node.labels)} -> {_compact(spec.labels)}")
            changes["labels"] = spec.labels
        if changes:
            self._step("nodes", spec.where, fleet.node_update, node=node, **changes)
        return details

    def _plan_gpus(self, spec: NodeSpec, node: Node) -> list[str]:
        details = []
        cards = {gpu.index: gpu for gpu in node.gpus.all()}
        for listed in spec.gpus:
            gpu = cards.get(listed.index)
            if gpu is None:
                continue  # the GPU count mismatch is reported already
            for field in ("uuid", "pci_address"):
                wanted = getattr(listed, field)
                if wanted is not None and wanted != getattr(gpu, field):
                    self._problem(
                        spec.where,
                        f"gpu_list: GPU {listed.index} {field} cannot change in place (registered "
                        f"{getattr(gpu, field)}, the file says {wanted})",
                    )
            if listed.health is not None and listed.health != gpu.health:
                details.append(f"GPU {listed.index} health {gpu.health} -> {listed.health}")
                self._step("nodes", spec.where, fleet.gpu_set_health, gpu=gpu, health=listed.health)
        return details

    # pools

    def _plan_pools(self) -> None:
        tenant_slugs = set(self.tenants) | {t.slug for t in self.file.tenants}
        groups: dict[tuple, list[PoolSpec]] = defaultdict(list)
        for spec in self.file.pools:
            fine = self._check_pool_refs(spec, tenant_slugs)
            pool = self.pools.get(spec.name)
            if pool is not None:
                now = {
                    "kind": pool.kind,
                    "cluster": pool.cluster.name,
                    "capacity_set": pool.capacity_set.name if pool.capacity_set else None,
                    "gpu_model": pool.gpu_model,
                    "fabric": pool.fabric,
                }
                for field, value in now.items():
                    wanted = getattr(spec, field)
                    if field in ("gpu_model", "fabric") and (
                        wanted is None or pool.capacity_set is not None
                    ):
                        continue  # a set's pool rents its set's GPUs: checked with the set
                    if wanted != value:
                        fine = False
                        self._problem(
                            spec.where,
                            _fixed_field(
                                field, spec.name, value or "none", wanted or "none", "pool"
                            ),
                        )
            if fine:
                groups[(spec.cluster, spec.capacity_set)].append(spec)
        for (cluster, set_name), specs in groups.items():
            self._plan_pool_group(cluster, set_name, specs)

    def _check_pool_refs(self, spec: PoolSpec, tenant_slugs: set[str]) -> bool:
        fine = True
        if not self._cluster_known(spec.cluster):
            fine = False
            self._problem(
                spec.where, f"cluster: no cluster named {spec.cluster} in the file or the database"
            )
        if spec.capacity_set is not None:
            facts = self._set_facts(spec.capacity_set)
            if facts is None:
                fine = False
                self._problem(
                    spec.where,
                    f"capacity_set: no capacity set named "
                    f"{spec.capacity_set} in the file or the database",
                )
            elif facts[0] != spec.cluster:
                fine = False
                self._problem(
                    spec.where,
                    f"capacity_set: {spec.capacity_set} belongs to cluster "
                    f"{facts[0]}, not {spec.cluster}",
                )
            else:
                for field, value, wanted in (
                    ("gpu_model", spec.gpu_model, facts[1]),
                    ("fabric", spec.fabric, facts[2]),
                ):
                    if value is not None and value != wanted:
                        fine = False
                        self._problem(
                            spec.where,
                            f"{field}: a pool of {spec.capacity_set} rents its {wanted}, not "
                            f"{value}; leave {field} out for a pool in a set",
                        )
        unknown = [slug for slug in spec.tenants if slug not in tenant_slugs]
        if unknown:
            fine = False
            self._problem(
                spec.where, f"tenants: no tenant {', '.join(unknown)} in the file or the database"
            )
        return fine

    def _plan_pool_group(self, cluster: str, set_name: str | None, specs: list[PoolSpec]) -> None:
        """Ranks, floors and tenants of the pools of one set (or of one cluster's standalone
        pools). A change of order goes through one re-rank of the whole group."""
        group = _group_text(cluster, set_name)
        in_file = {spec.name for spec in specs}
        others = {
            pool.name: pool.rank
            for pool in self.pools.values()
            if pool.name not in in_file
            and pool.cluster.name == cluster
            and (pool.capacity_set.name if pool.capacity_set else None) == set_name
        }
        holders = {rank: name for name, rank in others.items()}
        for spec in specs:
            if spec.rank in holders:
                name = holders[spec.rank]
                self._problem(
                    spec.where,
                    f"rank: {spec.rank} is held by {name} (one of {group}), which is not in "
                    f"this file; declare {name} in the file to re-rank it",
                )
        desired = {spec.name: spec.rank for spec in specs} | others
        moved = [s for s in specs if s.name in self.pools and self.pools[s.name].rank != s.rank]
        new = [s for s in specs if s.name not in self.pools]
        create_rank = {spec.name: spec.rank for spec in new}
        if moved:
            ranks = sorted(desired.values())
            if ranks != list(range(1, len(ranks) + 1)):
                self._problem(
                    moved[0].where,
                    f"rank: changing ranks re-ranks {group} as 1..{len(ranks)}; "
                    f"give them ranks 1..{len(ranks)} (now {', '.join(map(str, ranks))})",
                )
            # New pools wait above every rank in use until the one re-rank places them.
            spare = max([*desired.values(), *(p.rank for p in self.pools.values())], default=0)
            create_rank = {spec.name: spare + k for k, spec in enumerate(new, start=1)}
            order = sorted(desired, key=desired.__getitem__)
            self._step(
                "ranks",
                moved[0].where,
                _pools_rerank,
                cluster=cluster,
                capacity_set=set_name,
                order=order,
            )
        for spec in specs:
            self._plan_pool(spec, create_rank.get(spec.name))

    def _plan_pool(self, spec: PoolSpec, create_rank: int | None) -> None:
        pool = self.pools.get(spec.name)
        tenants = ", ".join(spec.tenants) or "none"
        if pool is None:
            where_to = (
                f"set {spec.capacity_set}"
                if spec.capacity_set
                else f"standalone on {spec.cluster} ({spec.gpu_model} {spec.fabric})"
            )
            self._change(
                "create",
                "pool",
                spec.name,
                f"{spec.kind}, {where_to}, rank {spec.rank}, floor {spec.floor_gpus} GPUs, "
                f"tenants {tenants}",
            )
            self._step("pools", spec.where, _pool_create, spec=spec, rank=create_rank)
            if spec.tenants:
                self._step(
                    "pool_tenants",
                    spec.where,
                    _pool_set_tenants,
                    name=spec.name,
                    slugs=spec.tenants,
                )
            return
        details = []
        if pool.rank != spec.rank:
            details.append(f"rank {pool.rank} -> {spec.rank}")
        if pool.floor_gpus != spec.floor_gpus:
            details.append(f"floor_gpus {pool.floor_gpus} -> {spec.floor_gpus}")
            phase = "floors_down" if spec.floor_gpus < pool.floor_gpus else "floors_up"
            self._step(
                phase, spec.where, fleet.pool_set_floor, pool=pool, floor_gpus=spec.floor_gpus
            )
        now = tuple(sorted(t.slug for t in pool.tenants.all()))
        if now != spec.tenants:
            details.append(f"tenants {', '.join(now) or 'none'} -> {tenants}")
            self._step(
                "pool_tenants", spec.where, _pool_set_tenants, name=spec.name, slugs=spec.tenants
            )
        if details:
            self._change("update", "pool", spec.name, details)
        else:
            self.unchanged += 1

    def _check_floors(self) -> None:
        """A set's floors must fit its GPUs once the file is applied; say so before applying."""
        set_now = {
            key: node.capacity_set.name if node.capacity_set else None
            for key, node in self.nodes.items()
        }
        node_sets = {key: (set_now[key], node.gpu_count) for key, node in self.nodes.items()}
        for spec in self.file.nodes:
            node_sets[(spec.cluster, spec.hostname)] = (spec.capacity_set, spec.gpu_count)
        totals: dict[str, int] = defaultdict(int)
        for set_name, gpu_count in node_sets.values():
            if set_name is not None:
                totals[set_name] += gpu_count
        floors = {
            p.name: (p.capacity_set.name if p.capacity_set else None, p.floor_gpus)
            for p in self.pools.values()
        }
        for spec in self.file.pools:
            floors[spec.name] = (spec.capacity_set, spec.floor_gpus)
        for set_name in sorted({s for s, _ in floors.values() if s is not None}):
            held = {name: floor for name, (s, floor) in floors.items() if s == set_name and floor}
            total = totals.get(set_name, 0)
            if sum(held.values()) <= total:
                continue
            blamed = [spec for spec in self.file.pools if spec.name in held]
            listed = ", ".join(f"{name} {floor}" for name, floor in sorted(held.items()))
            text = (
                f"the floors of capacity set {set_name}'s pools add up to "
                f"{sum(held.values())} GPUs ({listed}), more than the set's {total} GPUs"
            )
            if blamed:
                worst = max(blamed, key=lambda spec: spec.floor_gpus)
                self._problem(worst.where, f"floor_gpus: {text}")
            else:
                leaving = [
                    spec
                    for spec in self.file.nodes
                    if set_now.get((spec.cluster, spec.hostname)) == set_name
                    and spec.capacity_set != set_name
                ]
                where = leaving[0].where if leaving else f"capacity set {set_name}"
                self._problem(where, f"capacity_set: {text}")

    # what the database holds beyond the file

    def _left_as_is(self) -> list[tuple[str, list[str]]]:
        f = self.file
        member_keys = {(t.slug, m.username) for t in f.tenants for m in t.members}
        node_keys = {(n.cluster, n.hostname) for n in f.nodes}
        return [
            ("tenant", sorted(set(self.tenants) - {t.slug for t in f.tenants})),
            ("membership", sorted(f"{s}/{u}" for s, u in set(self.memberships) - member_keys)),
            ("operator", sorted(self.operators - {o.username for o in f.operators})),
            ("cluster", sorted(set(self.clusters) - {c.name for c in f.clusters})),
            ("capacity set", sorted(set(self.sets) - {s.name for s in f.capacity_sets})),
            ("node", sorted(f"{c}/{h}" for c, h in set(self.nodes) - node_keys)),
            ("pool", sorted(set(self.pools) - {p.name for p in f.pools})),
        ]


# --- steps: service calls that look objects up when they run (earlier steps create them) ------


def _capacity_set_create(*, spec: CapacitySetSpec, actor: Actor) -> None:
    fleet.capacity_set_create(
        cluster=Cluster.objects.get(name=spec.cluster),
        name=spec.name,
        gpu_model=spec.gpu_model,
        fabric=spec.fabric,
        notice_seconds=spec.notice_seconds,
        actor=actor,
    )


def _node_create(*, spec: NodeSpec, actor: Actor) -> None:
    gpus = [
        {key: value for key, value in asdict(gpu).items() if value is not None} for gpu in spec.gpus
    ]
    fleet.node_create(
        cluster=Cluster.objects.get(name=spec.cluster),
        hostname=spec.hostname,
        gpu_model=spec.gpu_model,
        fabric=spec.fabric,
        gpu_count=spec.gpu_count,
        partitions=spec.partitions,
        bmc_address=spec.bmc_address,
        labels=spec.labels,
        state=spec.state or Node.State.READY,
        gpus=gpus,
        actor=actor,
    )


def _node_set_state(*, node: Node, state: str, actor: Actor) -> None:
    fleet.node_set_state(node=node, state=state, actor=actor, message="fleet file")


def _node_join(*, cluster: str, hostname: str, capacity_set: str, actor: Actor) -> None:
    fleet.node_join_set(
        node=Node.objects.get(cluster__name=cluster, hostname=hostname),
        capacity_set=CapacitySet.objects.select_related("cluster").get(name=capacity_set),
        actor=actor,
    )


def _pool_create(*, spec: PoolSpec, rank: int, actor: Actor) -> None:
    fleet.pool_create(
        name=spec.name,
        kind=spec.kind,
        cluster=Cluster.objects.get(name=spec.cluster),
        capacity_set=(
            CapacitySet.objects.select_related("cluster").get(name=spec.capacity_set)
            if spec.capacity_set
            else None
        ),
        rank=rank,
        floor_gpus=spec.floor_gpus,
        gpu_model=spec.gpu_model or "",
        fabric=spec.fabric or "",
        actor=actor,
    )


def _pools_rerank(
    *, cluster: str, capacity_set: str | None, order: list[str], actor: Actor
) -> None:
    if capacity_set is None:
        fleet.pool_rerank(cluster=Cluster.objects.get(name=cluster), pool_names=order, actor=actor)
    else:
        fleet.pool_rerank(
            capacity_set=CapacitySet.objects.get(name=capacity_set), pool_names=order, actor=actor
        )


def _pool_set_tenants(*, name: str, slugs: tuple[str, ...], actor: Actor) -> None:
    fleet.pool_set_tenants(
        pool=Pool.objects.get(name=name),
        tenants=list(Tenant.objects.filter(slug__in=slugs)),
        actor=actor,
    )


def membership_set_by_name(*, username: str, slug: str, role: str, actor: Actor) -> None:
    tenancy.membership_set(
        user=get_user_model().objects.get(username=username),
        tenant=Tenant.objects.get(slug=slug),
        role=role,
        actor=actor,
    )


def operator_grant_by_name(*, username: str, actor: Actor) -> None:
    tenancy.operator_grant(user=get_user_model().objects.get(username=username), actor=actor)


# --- small helpers ------------------------------------------------------------------------------


# Service fields whose fleet-file key has another name.
_FILE_KEYS = {"gpu_count": "gpus", "gpus": "gpu_list", "pools": "rank"}


def _validation_messages(exc: ValidationError) -> list[str]:
    if not hasattr(exc, "error_dict"):
        return list(exc.messages)
    return [
        f"{_FILE_KEYS.get(field, field)}: {message}" if field != "__all__" else message
        for field, messages in exc.message_dict.items()
        for message in messages
    ]


def _fixed_field(field: str, name: str, value: object, wanted: object, noun: str) -> str:
    return (
        f"{field}: cannot change in place ({noun} {name} has {value}, the file says {wanted}); "
        f"declare a new {noun} instead"
    )


def _node_label(spec: NodeSpec) -> str:
    return f"{spec.cluster}/{spec.hostname}"


def _group_text(cluster: str, capacity_set: str | None) -> str:
    if capacity_set is None:
        return f"the standalone pools of cluster {cluster}"
    return f"the pools of capacity set {capacity_set}"


def _table_text(partitions: list | None) -> str:
    return f"a {len(partitions)}-partition table" if partitions else "the default table"


def _compact(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": ")) if value else "(none)"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _and_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
