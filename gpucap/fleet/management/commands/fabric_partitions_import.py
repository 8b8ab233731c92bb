"""``manage.py fabric_partitions_import HOSTNAME LISTING``: a node's NVLink partition table from
Fabric Manager's own listing (``nv-partitioner -o 0``, run on the node or its service VM)."""

import sys

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from gpucap.drivers.fabric_listing import FabricListingError, partitions_parse
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node


class Command(BaseCommand):
    help = (
        "Store a node's NVLink partition table from Fabric Manager's partition listing "
        "(the output of `nv-partitioner -o 0`, as a table or with -f csv). Module ids are mapped "
        "to GPU indices through each GPU's module_id; partitions the listing marks unsupported "
        "are left out. All or nothing: any problem changes nothing."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("hostname", help="the node, e.g. h100-001")
        parser.add_argument("listing", help="a file holding the listing, or - for standard input")
        parser.add_argument(
            "--cluster", help="the node's cluster, when the hostname is in more than one"
        )

    def handle(self, *args, hostname: str, listing: str, cluster: str | None, **options) -> None:
        node = _node(hostname, cluster)
        try:
            partitions = partitions_parse(_read(listing))
        except FabricListingError as exc:
            raise CommandError(f"{listing}: {exc}") from None
        supported = [p for p in partitions if p.supported]
        for partition in partitions:
            if not partition.supported:
                self.stdout.write(
                    f"left out {partition.describe()}: the listing marks it unsupported"
                )
        if not supported:
            raise CommandError(f"{listing}: every partition is marked unsupported; nothing stored")
        try:
            node = fleet.node_set_fabric_partitions(
                node=node, fabric_partitions=[(p.id, p.modules) for p in supported]
            )
        except ValidationError as exc:
            problems = [message for messages in exc.message_dict.values() for message in messages]
            raise CommandError(
                "\n".join([f"{node.hostname}: the partition table was not changed:", *problems])
            ) from None
        for block, partition_id in zip(node.partitions, node.fabric_partition_ids, strict=True):
            self.stdout.write(f"partition {partition_id}: GPUs {', '.join(map(str, block))}")
        summary = f"{node.hostname}: {len(supported)} partitions from Fabric Manager stored"
        left_out = len(partitions) - len(supported)
        if left_out:
            summary += f", {left_out} unsupported left out"
        self.stdout.write(summary)


def _node(hostname: str, cluster: str | None) -> Node:
    nodes = list(Node.objects.filter(hostname=hostname).select_related("cluster"))
    if cluster is not None:
        nodes = [node for node in nodes if node.cluster.name == cluster]
    if not nodes:
        where = f" in cluster {cluster}" if cluster else ""
        raise CommandError(f"no node {hostname}{where}")
    if len(nodes) > 1:
        clusters = ", ".join(sorted(node.cluster.name for node in nodes))
        raise CommandError(f"{hostname} is in clusters {clusters}: say which with --cluster")
    return nodes[0]


def _read(listing: str) -> str:
    if listing == "-":
        return sys.stdin.read()
    try:
        with open(listing, encoding="utf-8") as file:
            return file.read()
    except OSError as exc:
        raise CommandError(f"cannot read {listing}: {exc.strerror or exc}") from None
