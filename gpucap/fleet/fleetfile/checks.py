"""The rules of a fleet file that no single key can state: numbered hostnames, partition tables
and GPU lists checked against their node's fabric and GPU count, names declared twice, ranks
shared, a user declared twice who disagrees with itself. They see every value that passed its
own check (`schema`), so one run reports all of a file's mistakes."""

import re
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from gpucap.fleet import rules
from gpucap.fleet.fleetfile.spec import FORMAT_VERSION
from gpucap.fleet.fleetfile.words import group_text, line, locate, shown
from gpucap.fleet.models import IMAGE_NAME_PATTERN, LOGIN_USER_PATTERN, MAX_GPUS_PER_NODE, Fabric

NOT_BLANK = r"\S"
SLUG = r"^[-a-zA-Z0-9_]+$"
USERNAME = r"^[\w.@+-]+$"
PCI_ADDRESS = r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$"
MAX_COUNT = 1000  # nodes declared by one entry
IMAGE_NAME = IMAGE_NAME_PATTERN
LOGIN_USER = LOGIN_USER_PATTERN
HTTP_PATH = r"^/\S*$"
BASE_IMAGE = r"^[A-Za-z0-9_./:@+-]+$"

# What a value refused by a pattern may contain, in the words of its problem.
PATTERN_HINTS = {
    SLUG: "letters, digits, - and _",
    USERNAME: "letters, digits, @.+-_",
    PCI_ADDRESS: "like 0000:18:00.0, lower-case hex",
    IMAGE_NAME: "lowercase letters, digits, . _ and -, e.g. ubuntu-24.04-cuda-12.6",
    LOGIN_USER: "a login user name, e.g. ubuntu",
    HTTP_PATH: "an HTTP path starting with /, e.g. /v1/models",
    BASE_IMAGE: "an absolute path or a volume name, no spaces",
}


# --- rules across keys and items ----------------------------------------------------------------


@dataclass
class _Item:
    """One mapping of the file as the rules see it: a value that failed its own check reads as
    absent (its default), so no rule reports it a second time."""

    loc: tuple
    where: str
    raw: dict
    dropped: set

    def get(self, key: str, default: object = None) -> Any:
        value = self.raw.get(key)
        if value is None or (*self.loc, key) in self.dropped:
            return default
        return value

    def given(self, key: str) -> bool:
        """Whether the key is written in the file, with a value or not."""
        return key in self.raw

    def items(self, key: str) -> list:
        value = self.raw.get(key)
        return value if isinstance(value, list) else []


class Rules:
    """Checks what no single key can: walks the file as written, item by item, and collects
    ``found`` (sort key, line) and ``late`` lines (said after everything else)."""

    def __init__(self, raw: object, document: type, dropped: set, problem_locs: list) -> None:
        self.raw, self.document, self.dropped = raw, document, dropped
        self.problem_locs = list(problem_locs)
        self.found: list[tuple[list, str]] = []
        self.late: list[str] = []
        self._first: dict[tuple, str] = {}
        self._rank_holders: dict[tuple, str] = {}
        self._subnets: list[tuple[str, str]] = []  # (guest subnet, where) of the nodes so far
        self._run()

    def _item(self, loc: tuple) -> _Item:
        place = locate(self.raw, loc, self.document)
        raw = _raw_at(self.raw, loc)
        return _Item(loc, place.where, raw if isinstance(raw, dict) else {}, self.dropped)

    def _add(
        self,
        item: _Item,
        rest: tuple,
        reason: str,
        *,
        slot: str | None = None,
        where: str | None = None,
    ) -> None:
        place = locate(self.raw, item.loc, self.document)
        self.found.append((place.order(rest, slot), line(where or item.where, rest, reason)))
        self.problem_locs.append((*item.loc, *rest))

    def _clean(self, item: _Item) -> bool:
        n = len(item.loc)
        return not any(loc[:n] == item.loc for loc in self.problem_locs)

    def _unique(self, item: _Item, kind: str, key: str, value: object, scope: str = "") -> None:
        first = self._first.setdefault((kind, scope, value), item.where)
        if first != item.where:
            self._add(
                item, (key,), f"{value} is declared twice (first at {first})", slot=f"{key}:twice"
            )

    def _run(self) -> None:
        top = self._item(())
        version = top.get("version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            self._add(
                top,
                ("version",),
                f"this gpucap reads version {FORMAT_VERSION} files, got {version}",
            )
        tenants = [self._tenant(("tenants", i)) for i in range(len(top.items("tenants")))]
        operators = [self._operator(("operators", i)) for i in range(len(top.items("operators")))]
        for i in range(len(top.items("clusters"))):
            self._cluster(("clusters", i))
        for i in range(len(top.items("capacity_sets"))):
            self._capacity_set(("capacity_sets", i))
        for i in range(len(top.items("pools"))):
            self._pool(("pools", i))
        for i in range(len(top.items("images"))):
            self._image(("images", i))
        people = [m for t in tenants if self._clean(t[0]) for m in t[1]]
        self._check_users(people + [o for o in operators if self._clean(o)])

    # tenants and people

    def _tenant(self, loc: tuple) -> tuple[_Item, list[_Item]]:
        tenant = self._item(loc)
        name, slug = tenant.get("name"), tenant.get("slug")
        if slug:
            self._unique(tenant, "tenant", "slug", slug)
        if name:
            self._unique(tenant, "tenant name", "name", name)
        members = []
        for j in range(len(tenant.items("members"))):
            member = self._item((*loc, "members", j))
            username = member.get("username")
            if username:
                self._unique(member, "member", "username", username, scope=f"tenants[{loc[1]}]")
            self._email(member)
            members.append(member)
        return tenant, members

    def _operator(self, loc: tuple) -> _Item:
        operator = self._item(loc)
        username = operator.get("username")
        if username:
            self._unique(operator, "operator", "username", username)
        self._email(operator)
        return operator

    def _email(self, person: _Item) -> None:
        email = person.get("email")
        if email:
            try:
                validate_email(email)
            except ValidationError:
                self._add(person, ("email",), f"{email!r} is not an email address")

    def _check_users(self, people: list[_Item]) -> None:
        """One user may be declared in several places (two tenants, or a member who is also an
        operator); the places must agree on the email and password."""
        declared: dict[str, _Item] = {}
        for person in people:
            first = declared.setdefault(person.get("username"), person)
            for field in ("email", "password"):
                mine, theirs = person.get(field), first.get(field)
                if mine is not None and theirs is not None and mine != theirs:
                    self.late.append(
                        f"{person.where}: {field}: differs from the {field} given for the same "
                        f"user at {first.where}"
                    )
            if first.get("email") is None and person.get("email") is not None:
                declared[person.get("username")] = person

    # clusters and nodes

    def _cluster(self, loc: tuple) -> None:
        cluster = self._item(loc)
        name = cluster.get("name")
        if name:
            self._unique(cluster, "cluster", "name", name)
        self._text_keys(cluster, "driver_settings")
        for j in range(len(cluster.items("nodes"))):
            self._node(name, (*loc, "nodes", j))

    def _text_keys(self, item: _Item, key: str) -> dict | None:
        value = item.get(key)
        if value is not None and not rules.mapping_has_text_keys(value):
            self._add(item, (key,), f"must be a mapping with text keys, got {shown(value)}")
            return None
        return value

    def _node(self, cluster: str | None, loc: tuple) -> None:
        node = self._item(loc)
        count, start = node.get("count"), node.get("start", 1)
        if node.given("start") and not node.given("count"):
            self._add(
                node, ("start",), "goes with count; a single node has no number", slot="start:alone"
            )
        fabric, gpu_count = node.get("fabric"), node.get("gpus")
        labels = self._text_keys(node, "labels")
        for name in rules.labels_not_text(labels or {}):
            self._add(
                node,
                ("labels",),
                f'the value of {name} must be text; quote it: {name}: "{labels[name]}"',
            )
        partitions = node.raw.get("partitions")
        if partitions is not None and fabric == Fabric.PCIE:
            for problem in rules.node_partitions_problems(
                fabric=fabric, gpu_count=gpu_count or 0, partitions=partitions
            ):
                self._add(node, ("partitions",), f"{problem}; this node is pcie")
        elif partitions is not None and gpu_count is not None:
            # A fabric that failed its own check is taken for NVSwitch: the table is still
            # worth checking.
            for problem in rules.node_partitions_problems(
                fabric=Fabric.NVSWITCH, gpu_count=gpu_count, partitions=partitions
            ):
                self._add(node, ("partitions",), problem)
        self._gpu_list(node, gpu_count, count)
        numbered = self._hostnames(node, count, start)
        _, problem = numbered_bmc_addresses(
            node.get("bmc_address", ""), numbered, counted=count is not None
        )
        if problem:
            self._add(node, ("bmc_address",), problem, slot="bmc_address:numbered")
        self._guest_network(node, numbered, counted=count is not None, path=loc)
        if not self._clean(node) or cluster is None:
            return
        path = f"clusters[{loc[1]}].nodes[{loc[3]}]"
        for _, hostname in numbered:
            where = f"{path} ({hostname})"
            first = self._first.setdefault(("node", cluster, hostname), where)
            if first != where:
                self._add(
                    node,
                    ("hostname",),
                    f"{hostname} is declared twice in cluster {cluster} (first at {first})",
                    slot="hostname:twice",
                    where=where,
                )

    def _guest_network(self, node: _Item, numbered: list, *, counted: bool, path: tuple) -> None:
        """The bridge and subnet, as the fleet services check them; a pattern gives each
        numbered node its own subnet; no two nodes' subnets overlap (guests are told apart by
        address across the fleet)."""
        bridge, pattern = node.get("guest_bridge", ""), node.get("guest_subnet", "")
        if bridge and rules.guest_bridge_problem(bridge):
            self._add(node, ("guest_bridge",), rules.guest_bridge_problem(bridge))
        if not pattern:
            return
        if not node.raw.get("guest_bridge"):
            self._add(
                node,
                ("guest_bridge",),
                "is required with a guest_subnet: the bridge its guests' interfaces join",
            )
        if counted and len(numbered) > 1 and "{" not in pattern:
            self._add(
                node,
                ("guest_subnet",),
                f"{pattern} cannot be the subnet of {len(numbered)} nodes; give a pattern with "
                "one number field, such as 10.200.{}.0/24",
                slot="guest_subnet:numbered",
            )
            return
        subnets, problem = numbered_bmc_addresses(pattern, numbered, counted=counted)
        if problem:
            self._add(node, ("guest_subnet",), problem, slot="guest_subnet:numbered")
            return
        prefix = f"clusters[{path[1]}].nodes[{path[3]}]"
        for (_, hostname), subnet in zip(numbered, subnets, strict=True):
            problem = rules.guest_subnet_problem(subnet)
            if problem:
                self._add(node, ("guest_subnet",), problem)
                return
            where = f"{prefix} ({hostname})"
            for other, other_where in self._subnets:
                if rules.guest_subnets_overlap(subnet, other):
                    self._add(
                        node,
                        ("guest_subnet",),
                        f"{subnet} overlaps {other} of {other_where}; guests are told apart "
                        "by address across the fleet",
                        slot="guest_subnet:overlap",
                        where=where,
                    )
                    break
            else:
                self._subnets.append((subnet, where))

    def _gpu_list(self, node: _Item, gpu_count: int | None, count: int | None) -> None:
        seen = set()
        modules: dict[int, int] = {}  # module id -> the GPU index first given it
        high = (gpu_count or MAX_GPUS_PER_NODE) - 1
        for k in range(len(node.items("gpu_list"))):
            gpu = self._item((*node.loc, "gpu_list", k))
            index = gpu.get("index")
            if index is not None and not 0 <= index <= high:
                self._add(gpu, ("index",), f"must be 0..{high}, got {index}")
                index = None
            if index is not None and index in seen:
                self._add(gpu, ("index",), f"GPU {index} is listed twice")
            seen.add(index)
            module_id = gpu.get("module_id")
            if module_id is not None and module_id in modules:
                self._add(
                    gpu,
                    ("module_id",),
                    f"module {module_id} is already GPU {modules[module_id]}'s; each card has "
                    "its own module id",
                )
            elif module_id is not None:
                modules[module_id] = index
            if gpu.get("uuid") and count is not None and count > 1:
                self._add(
                    gpu, ("uuid",), f"a UUID names one card; it cannot be given to {count} nodes"
                )

    def _hostnames(self, node: _Item, count: int | None, start: int) -> list:
        pattern = node.get("hostname")
        if pattern is None:
            return []
        numbered, problem = numbered_hostnames(pattern, count, start)
        if problem:
            self._add(node, ("hostname",), problem, slot="hostname:numbered")
        return numbered

    # capacity sets and pools

    def _capacity_set(self, loc: tuple) -> None:
        capacity_set = self._item(loc)
        name = capacity_set.get("name")
        if name:
            self._unique(capacity_set, "capacity set", "name", name)
        if capacity_set.given("mode"):
            self._add(
                capacity_set,
                ("mode",),
                "cannot be set from a fleet file: a new set starts in dry_run and an "
                "operator enables enforcement on the set's page",
            )

    def _pool(self, loc: tuple) -> None:
        pool = self._item(loc)
        name = pool.get("name")
        if name:
            self._unique(pool, "pool", "name", name)
        tenants = []
        for k, slug in enumerate(pool.items("tenants")):
            if not isinstance(slug, str) or not re.match(SLUG, slug):
                self._add(pool, ("tenants", k), f"must be a tenant slug, got {shown(slug)}")
            elif slug in tenants:
                self._add(pool, ("tenants", k), f"{slug} is listed twice")
            else:
                tenants.append(slug)
        cluster, capacity_set, rank = (
            pool.get("cluster"),
            pool.get("capacity_set"),
            pool.get("rank"),
        )
        if cluster and rank:
            # Ranks are unique within a set, and among a cluster's standalone pools.
            first = self._rank_holders.setdefault((cluster, capacity_set, rank), pool.where)
            if first != pool.where:
                self._add(
                    pool,
                    ("rank",),
                    f"{rank} is also the rank of {first} among "
                    f"{group_text(cluster, capacity_set)}; ranks are unique there",
                    slot="rank:twice",
                )
        if capacity_set is None:
            # A set's pools rent the set's GPUs; a standalone pool says which of its cluster's
            # standalone nodes it places on.
            for key, what in (
                ("gpu_model", "GPU model"),
                ("fabric", "fabric (pcie or nvswitch)"),
            ):
                if pool.raw.get(key) is None:
                    self._add(
                        pool,
                        (key,),
                        f"is required for a standalone pool: the {what} of the cluster's "
                        "standalone nodes it places on",
                        slot=f"{key}:standalone",
                    )

    # the image catalogue

    def _image(self, loc: tuple) -> None:
        image = self._item(loc)
        name, cluster = image.get("name"), image.get("cluster")
        if name and cluster:
            self._unique(image, "image", "name", name, scope=cluster)
        node_paths = self._text_keys(image, "node_paths") or {}
        for host, path in node_paths.items():
            if not isinstance(path, str) or not re.match(BASE_IMAGE, path):
                self._add(
                    image,
                    ("node_paths", host),
                    f"must be an absolute path or a volume name, got {shown(path)}",
                )
        seen = set()
        for k, port in enumerate(image.items("ports")):
            if isinstance(port, int) and not 1 <= port <= 65535:
                self._add(image, ("ports", k), f"must be a TCP port 1..65535, got {port}")
            elif port in seen:
                self._add(image, ("ports", k), f"{port} is listed twice")
            seen.add(port)


def _raw_at(raw: object, loc: tuple) -> object:
    for step in loc:
        if isinstance(step, str):
            raw = raw.get(step) if isinstance(raw, dict) else None
        else:
            raw = raw[step] if isinstance(raw, list) and step < len(raw) else None
    return raw


# --- numbered nodes -----------------------------------------------------------------------------


def numbered_hostnames(
    pattern: str, count: int | None, start: int | None
) -> tuple[list[tuple[int | None, str]], str]:
    """The hostnames an entry declares, each with its number, and why they cannot be ("": they
    can)."""
    if count is None:
        if "{" in pattern or "}" in pattern:
            return [], f"{pattern!r} is a pattern; give count (and start) with it"
        numbered: list[tuple[int | None, str]] = [(None, pattern)]
    else:
        first = start if start is not None else 1
        try:
            numbered = [(n, pattern.format(n)) for n in range(first, first + count)]
        except (ValueError, IndexError, KeyError) as exc:
            return [], (
                f"{pattern!r} is not a pattern with one number field, such as h100-{{:03d}} ({exc})"
            )
        if len({hostname for _, hostname in numbered}) != count:
            return [], (
                f"{pattern!r} gives the {count} nodes the same name; put a "
                "number field such as {:03d} in it"
            )
    for _, hostname in numbered:
        if problem := rules.hostname_problem(hostname):
            return [], problem
    return numbered, ""


def numbered_bmc_addresses(
    pattern: str | None, numbered: list, *, counted: bool
) -> tuple[list[str], str]:
    pattern = pattern or ""
    if not counted or "{" not in pattern:
        return [pattern] * len(numbered), ""
    try:
        return [pattern.format(n) for n, _ in numbered], ""
    except (ValueError, IndexError, KeyError) as exc:
        return [pattern] * len(numbered), (
            f"{pattern!r} is not a pattern with one number field ({exc})"
        )
