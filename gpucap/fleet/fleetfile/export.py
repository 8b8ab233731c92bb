"""Writing the fleet back as a fleet file (``manage.py fleet_export``)."""

import re

import yaml
from django.contrib.auth import get_user_model
from django.db.models import Prefetch

from gpucap.fleet import services as fleet
from gpucap.fleet.fleetfile.sections import file_sections, set_sections
from gpucap.fleet.fleetfile.spec import FORMAT_VERSION
from gpucap.fleet.models import CapacitySet, Cluster, Gpu, Image, Node, Pool
from gpucap.roles import OPERATORS_GROUP
from gpucap.tenancy.models import Membership, Tenant

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
        "images": _export_images(),
    }
    # The top-level sections apps above the fleet add (the tenants' quotas), after the rest.
    for section in file_sections():
        if value := section.export_file():
            document[section.key] = [_flow_leaves(item) for item in value]
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
    nodes = Node.objects.select_related("capacity_set", "dedicated_tenant").order_by("hostname")
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
    if node.guest_bridge:
        entry["guest_bridge"] = node.guest_bridge
    if node.guest_subnet:
        entry["guest_subnet"] = node.guest_subnet
    if node.dedicated_tenant is not None:
        entry["dedicated_to"] = node.dedicated_tenant.slug
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
        if gpu.module_id is not None:
            listed["module_id"] = gpu.module_id
        if gpu.health != Gpu.Health.OK:
            listed["health"] = gpu.health
        if listed:
            gpu_list.append(_flow({"index": gpu.index, **listed}))
    if gpu_list:
        entry["gpu_list"] = gpu_list
    return entry


def _export_capacity_sets() -> list:
    capacity_sets = list(CapacitySet.objects.select_related("cluster").order_by("name"))
    exported = {
        s.name: {
            "name": s.name,
            "cluster": s.cluster.name,
            "gpu_model": s.gpu_model,
            "fabric": s.fabric,
            "notice_seconds": s.notice_seconds,
        }
        for s in capacity_sets
    }
    # The sections apps above the fleet add to a set (its schedule), after the set's own keys.
    for section in set_sections():
        for name, value in section.export(capacity_sets).items():
            exported[name][section.key] = _flow_leaves(value)
    return list(exported.values())


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
        if pool.protect_seconds:
            entry["protect_seconds"] = pool.protect_seconds
        slugs = [t.slug for t in pool.tenants.all()]
        if slugs:
            entry["tenants"] = _flow(slugs)
        exported.append(entry)
    return exported


def _export_images() -> list:
    exported = []
    for image in Image.objects.select_related("cluster").order_by("cluster__name", "name"):
        entry: dict = {
            "name": image.name,
            "cluster": image.cluster.name,
            "base_image": image.base_image,
        }
        if image.node_paths:
            entry["node_paths"] = _sorted_json(image.node_paths)
        entry["default_user"] = image.default_user
        if image.ports:
            entry["ports"] = _flow(list(image.ports))
        entry["health_path"] = image.health_path
        if image.description:
            entry["description"] = image.description
        entry["enabled"] = image.enabled
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


def _flow_leaves(value: object) -> object:
    """``value`` with each list or mapping of plain values marked to be written on one line."""
    if isinstance(value, dict | list):
        items = value.values() if isinstance(value, dict) else value
        if items and not any(isinstance(item, dict | list) for item in items):
            return _flow(value)
        if isinstance(value, dict):
            return {key: _flow_leaves(item) for key, item in value.items()}
        return [_flow_leaves(item) for item in value]
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


def _text(dumper: _Dumper, value: str) -> yaml.Node:
    # A time of day is always quoted ("08:00"): unquoted, YAML 1.1 reads 20:00 as the number
    # 1200 (base 60).
    style = '"' if _CLOCK.match(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_CLOCK = re.compile(r"^\d{1,2}:\d{2}(:\d{2})?$")
_Dumper.add_representer(str, _text)
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
