"""Reading a fleet file: YAML text in, checked specs out (docs/fleet-file.md).

The keys of each item and what each must hold are declared once, as pydantic models; pydantic
collects every problem of a file in one pass. `checks` words its findings as gpucap always has
("clusters[0].nodes[3] (h100-004): gpus: must be 1..8, got 9") and adds the rules that span
several keys or items (count patterns, partition tables, duplicates, ranks)."""

import dataclasses
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from gpucap.fleet import rules
from gpucap.fleet.fleetfile import checks, problems, sections
from gpucap.fleet.fleetfile.sections import SectionSpec
from gpucap.fleet.fleetfile.spec import (
    FORMAT_VERSION,
    CapacitySetSpec,
    ClusterSpec,
    FleetFile,
    FleetFileError,
    GpuSpec,
    ImageSpec,
    MemberSpec,
    NodeSpec,
    OperatorSpec,
    PoolSpec,
    TenantSpec,
)
from gpucap.fleet.fleetfile.words import where_of
from gpucap.fleet.models import MAX_GPUS_PER_NODE, Cluster, Fabric, Gpu, Node, Pool
from gpucap.tenancy.models import Membership


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
    raw = {} if raw is None else raw
    raw, set_sections = sections.sections_apart(raw)
    raw, file_sections = sections.file_sections_apart(raw)
    try:
        document = Document.model_validate(raw)
        errors = []
    except ValidationError as exc:
        document, errors = None, exc.errors(include_url=False)
    found = problems.fleet_file_problems(
        raw,
        errors,
        document=Document,
        extra=[
            *sections.section_problems(raw, set_sections, document=Document),
            *sections.file_section_problems(file_sections),
        ],
    )
    if found:
        raise FleetFileError([f"{source}: {problem}" for problem in found])
    fleet_file = _fleet_file(document, raw, source=source, set_sections=set_sections)
    return dataclasses.replace(fleet_file, sections=tuple(file_sections))


# --- YAML ---------------------------------------------------------------------------------------


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


# --- what each item of the file may hold --------------------------------------------------------


def _text(max_length: int = 253, pattern: str = checks.NOT_BLANK) -> Any:
    return Annotated[str, StringConstraints(max_length=max_length, pattern=pattern)]


def _whole(low: int, high: int | None = None) -> Any:
    return Annotated[int, Field(ge=low, le=high)]


def _one_of(values: list[str]) -> Any:
    return Literal[tuple(values)]


Slug = _text(64, checks.SLUG)
Username = _text(150, checks.USERNAME)
Email = _text(254)  # and an address: checked with the rules (`checks`)
GpuModel = _text(64)


class Entry(BaseModel):
    """One mapping of the file. Strict: YAML's own types, no coercion ("8" is not 8)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, regex_engine="python-re")

    # The key whose value names an item in problems: "pools[2] (h100-spot)".
    label_key: ClassVar[str | None] = None
    # The order an item's problems are reported in, when it is not the order of its keys. A
    # rule reported apart from its key has a slot of its own ("rank:twice", see `checks`);
    # any other follows its key's problems.
    report_order: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _nothing_is_absent(cls, raw: object) -> object:
        # ``key:`` with no value reads as null: the same as leaving the key out.
        if isinstance(raw, dict):
            fields = cls.model_fields
            return {k: v for k, v in raw.items() if v is not None or k not in fields}
        return raw


class MemberEntry(Entry):
    label_key = "username"
    username: Username
    email: Email | None = None
    role: _one_of(Membership.Role.values) = Membership.Role.MEMBER
    password: _text(128) | None = None


class TenantEntry(Entry):
    label_key = "slug"
    report_order = ("name", "slug", "slug:twice", "name:twice", "members")  # as checked
    name: _text(200)
    slug: Slug
    members: list[MemberEntry] = []


class OperatorEntry(Entry):
    label_key = "username"
    username: Username
    email: Email | None = None
    password: _text(128) | None = None


class GpuEntry(Entry):
    index: int  # 0..gpus-1 of its node: checked with the node
    uuid: _text(64) | None = None
    pci_address: _text(16, checks.PCI_ADDRESS) | None = None
    module_id: _whole(1, MAX_GPUS_PER_NODE) | None = None  # Fabric Manager's module id
    health: _one_of(Gpu.Health.values) | None = None


class NodeEntry(Entry):
    """One node, or with ``count`` that many alike whose hostname (and BMC address) is a
    pattern such as ``h100-{:03d}``."""

    label_key = "hostname"
    report_order = (
        *("count", "start", "start:alone", "hostname", "gpu_model", "fabric", "gpus"),
        *("capacity_set", "state", "bmc_address", "labels", "partitions", "gpu_list"),
        *("guest_bridge", "guest_subnet", "dedicated_to"),
        *("hostname:numbered", "bmc_address:numbered", "guest_subnet:numbered"),
        *("hostname:twice", "guest_subnet:overlap"),
    )
    hostname: _text(253)
    count: _whole(1, checks.MAX_COUNT) | None = None
    start: _whole(0) = 1
    gpu_model: GpuModel
    fabric: _one_of(Fabric.values)
    gpus: _whole(1, MAX_GPUS_PER_NODE)
    capacity_set: Slug | None = None
    state: _one_of(Node.State.values) | None = None
    bmc_address: _text(253) = ""
    labels: dict | None = None
    partitions: Any = None  # checked with the node's fabric and GPU count
    gpu_list: list[GpuEntry] = []
    guest_bridge: _text(15) = ""  # an interface name: checked with the rules (`checks`)
    # A subnet, or with ``count`` a pattern such as 10.200.{}.0/24: checked with the rules.
    guest_subnet: _text(64) = ""
    # The tenant (slug) the whole node is dedicated to; absent: shared by every tenant.
    dedicated_to: Slug | None = None


class ClusterEntry(Entry):
    label_key = "name"
    name: Slug
    driver: _one_of(Cluster.Driver.values) = Cluster.Driver.SIMULATED
    driver_settings: dict | None = None
    nodes: list[NodeEntry] = []


class CapacitySetEntry(Entry):
    label_key = "name"
    report_order = ("name", "mode", "cluster", "gpu_model", "fabric", "notice_seconds")
    name: Slug
    cluster: Slug
    gpu_model: GpuModel
    fabric: _one_of(Fabric.values)
    notice_seconds: _whole(rules.NOTICE_SECONDS_MIN, rules.NOTICE_SECONDS_MAX) = 120
    mode: Any = None  # never accepted: a new set starts in dry_run


class PoolEntry(Entry):
    label_key = "name"
    report_order = (
        *("name", "tenants", "kind", "cluster", "capacity_set", "gpu_model"),
        *("fabric", "rank", "floor_gpus", "protect_seconds", "rank:twice"),
        "gpu_model:standalone",
        "fabric:standalone",
    )
    name: Slug
    kind: _one_of(Pool.Kind.values)
    cluster: Slug
    capacity_set: Slug | None = None
    # Required of a standalone pool only; a pool in a set rents the set's GPUs.
    gpu_model: GpuModel | None = None
    fabric: _one_of(Fabric.values) | None = None
    rank: _whole(1)
    floor_gpus: _whole(0) = 0
    protect_seconds: _whole(0, rules.PROTECT_SECONDS_MAX) = 0
    tenants: list = []  # tenant slugs


class ImageEntry(Entry):
    """One image of a cluster's catalogue (what tenants choose when they ask for a VM)."""

    label_key = "name"
    report_order = (
        *("name", "cluster", "base_image", "node_paths", "default_user", "ports"),
        *("health_path", "description", "enabled", "name:twice"),
    )
    name: _text(64, checks.IMAGE_NAME)
    cluster: Slug
    base_image: _text(500, checks.BASE_IMAGE)
    node_paths: dict | None = None  # hostname -> base image on that node
    default_user: _text(32, checks.LOGIN_USER) = "root"
    ports: list[int] = []  # 1..65535 each: checked with the rules (`checks`)
    health_path: _text(200, checks.HTTP_PATH) = "/v1/models"
    description: Annotated[str, StringConstraints(max_length=2000)] = ""
    enabled: bool = True


class Document(Entry):
    version: int = FORMAT_VERSION
    tenants: list[TenantEntry] = []
    operators: list[OperatorEntry] = []
    clusters: list[ClusterEntry] = []
    capacity_sets: list[CapacitySetEntry] = []
    pools: list[PoolEntry] = []
    images: list[ImageEntry] = []


# --- specs --------------------------------------------------------------------------------------


def _fleet_file(
    document: Document, raw: dict, *, source: str, set_sections: dict[int, list[SectionSpec]]
) -> FleetFile:
    def where(*loc: str | int) -> str:
        return where_of(raw, loc, document=Document)

    tenants = tuple(
        TenantSpec(
            where=where("tenants", i),
            name=tenant.name,
            slug=tenant.slug,
            members=tuple(
                MemberSpec(
                    where=where("tenants", i, "members", j),
                    username=m.username,
                    email=m.email,
                    role=m.role,
                    password=m.password,
                )
                for j, m in enumerate(tenant.members)
            ),
        )
        for i, tenant in enumerate(document.tenants)
    )
    operators = tuple(
        OperatorSpec(
            where=where("operators", i), username=o.username, email=o.email, password=o.password
        )
        for i, o in enumerate(document.operators)
    )
    clusters = tuple(
        ClusterSpec(
            where=where("clusters", i),
            name=c.name,
            driver=c.driver,
            driver_settings=c.driver_settings or {},
        )
        for i, c in enumerate(document.clusters)
    )
    nodes = tuple(
        spec
        for i, cluster in enumerate(document.clusters)
        for j, node in enumerate(cluster.nodes)
        for spec in _node_specs(f"clusters[{i}].nodes[{j}]", cluster.name, node)
    )
    capacity_sets = tuple(
        CapacitySetSpec(
            where=where("capacity_sets", i),
            name=s.name,
            cluster=s.cluster,
            gpu_model=s.gpu_model,
            fabric=s.fabric,
            notice_seconds=s.notice_seconds,
            sections=tuple(set_sections.get(i, ())),
        )
        for i, s in enumerate(document.capacity_sets)
    )
    pools = tuple(
        PoolSpec(
            where=where("pools", i),
            name=p.name,
            kind=p.kind,
            cluster=p.cluster,
            capacity_set=p.capacity_set,
            gpu_model=p.gpu_model,
            fabric=p.fabric,
            rank=p.rank,
            floor_gpus=p.floor_gpus,
            protect_seconds=p.protect_seconds,
            tenants=tuple(sorted(p.tenants)),
        )
        for i, p in enumerate(document.pools)
    )
    images = tuple(
        ImageSpec(
            where=where("images", i),
            name=m.name,
            cluster=m.cluster,
            base_image=m.base_image,
            node_paths=m.node_paths or {},
            default_user=m.default_user,
            ports=tuple(m.ports),
            health_path=m.health_path,
            description=m.description,
            enabled=m.enabled,
        )
        for i, m in enumerate(document.images)
    )
    return FleetFile(
        source=source,
        images=images,
        tenants=tenants,
        operators=operators,
        clusters=clusters,
        nodes=nodes,
        capacity_sets=capacity_sets,
        pools=pools,
    )


def _node_specs(path: str, cluster: str, node: NodeEntry) -> list[NodeSpec]:
    numbered, _ = checks.numbered_hostnames(node.hostname, node.count, node.start)
    bmc_addresses, _ = checks.numbered_bmc_addresses(
        node.bmc_address, numbered, counted=node.count is not None
    )
    subnets, _ = checks.numbered_bmc_addresses(
        node.guest_subnet, numbered, counted=node.count is not None
    )
    gpus = tuple(
        GpuSpec(
            index=g.index,
            uuid=g.uuid,
            pci_address=g.pci_address,
            module_id=g.module_id,
            health=g.health,
        )
        for g in node.gpu_list
    )
    return [
        NodeSpec(
            where=f"{path} ({hostname})",
            cluster=cluster,
            hostname=hostname,
            gpu_model=node.gpu_model,
            fabric=node.fabric,
            gpu_count=node.gpus,
            capacity_set=node.capacity_set,
            state=node.state,
            partitions=node.partitions,
            bmc_address=bmc_address,
            labels=node.labels or {},
            gpus=gpus,
            guest_bridge=node.guest_bridge,
            guest_subnet=guest_subnet,
            dedicated_to=node.dedicated_to,
        )
        for (_, hostname), bmc_address, guest_subnet in zip(
            numbered, bmc_addresses, subnets, strict=True
        )
    ]
