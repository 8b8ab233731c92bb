"""Rules of the fleet that more than one writer checks: the fleet services before they write,
and a fleet file's diff before it applies anything (gpucap.fleet.fleetfile). Each rule is
stated once, here; a caller may word the context around it (a file names its keys), never the
rule itself. Topology rules (block sizes, partition tables) live in gpucap.arbiter.topology."""

import ipaddress
import re
from collections.abc import Sequence

from gpucap.arbiter.topology import partition_table_problems
from gpucap.fleet.models import HOSTNAME, HOSTNAME_RULE, INTERFACE_NAME, Fabric

# How long a capacity set's interruption notice may be, in seconds.
NOTICE_SECONDS_MIN = 1
NOTICE_SECONDS_MAX = 86400
# How long a pool may protect a VM that started or resumed from reclaims, in seconds (0: off).
PROTECT_SECONDS_MAX = 7 * 24 * 3600
# The smallest guest subnet: /30 holds the gateway and one guest.
GUEST_PREFIX_MAX = 30


def node_partitions_problems(
    *, fabric: str, gpu_count: int, partitions: object, names: Sequence[str] | None = None
) -> list[str]:
    """What is wrong with a partition table given for a node (empty: nothing). ``names``: how
    to call each partition (default "partition 1", "partition 2", ...)."""
    if fabric != Fabric.NVSWITCH:
        return ["only NVSwitch nodes carry a partition table"]
    return partition_table_problems(partitions, gpu_count, names=names)


def protect_seconds_problem(protect_seconds: object) -> str:
    """Why ``protect_seconds`` cannot be a pool's protection window, or ""."""
    if (
        not isinstance(protect_seconds, int)
        or isinstance(protect_seconds, bool)
        or not 0 <= protect_seconds <= PROTECT_SECONDS_MAX
    ):
        return (
            f"must be a whole number of seconds from 0 (off) to {PROTECT_SECONDS_MAX} (7 days), "
            f"got {protect_seconds!r}"
        )
    return ""


def hostname_problem(hostname: object) -> str:
    """Why ``hostname`` cannot be a node's hostname, or ""."""
    if not isinstance(hostname, str) or len(hostname) > 253 or not re.match(HOSTNAME, hostname):
        return f"{hostname!r} {HOSTNAME_RULE}"
    return ""


def mapping_has_text_keys(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(key, str) for key in value)


def labels_not_text(labels: dict) -> list[str]:
    """The names of the labels whose value is not text."""
    return [name for name, value in labels.items() if not isinstance(value, str)]


def labels_problem(labels: object) -> str:
    """Why ``labels`` are not a node's labels (text keys, text values), or ""."""
    if not mapping_has_text_keys(labels) or labels_not_text(labels):
        return "must be a mapping of text keys to text values"
    return ""


def node_join_problem(
    *,
    hostname: str,
    cluster: str,
    gpu_model: str,
    fabric: str,
    set_name: str,
    set_cluster: str,
    set_gpu_model: str,
    set_fabric: str,
) -> str:
    """Why a node may not join a capacity set (DESIGN.md section 2: a set holds the nodes of one
    cluster, GPU model and fabric), or ""."""
    mismatches = []
    if cluster != set_cluster:
        mismatches.append(f"cluster {cluster} is not the set's cluster {set_cluster}")
    if gpu_model != set_gpu_model:
        mismatches.append(f"GPU model {gpu_model} is not the set's {set_gpu_model}")
    if fabric != set_fabric:
        mismatches.append(f"fabric {fabric} is not the set's {set_fabric}")
    if not mismatches:
        return ""
    return f"node {hostname} cannot join {set_name}: " + "; ".join(mismatches)


def set_pool_gpu_problems(
    *, set_name: str, set_gpu_model: str, set_fabric: str, gpu_model: str, fabric: str
) -> dict[str, str]:
    """A pool in a capacity set rents the set's GPUs: a GPU model or fabric it names (it need
    not name any) must be the set's. Problems by field."""
    problems = {}
    for field, value, wanted in (
        ("gpu_model", gpu_model, set_gpu_model),
        ("fabric", fabric, set_fabric),
    ):
        if value and value != wanted:
            problems[field] = f"a pool of {set_name} rents its {wanted}, not {value}"
    return problems


def floors_fit(*, floor_gpus: int, set_gpus: int) -> bool:
    """The floors of a set's pools together fit in the set's GPUs (rule 2 of the arbiter needs
    them to: a floor the set cannot hold can never be kept)."""
    return floor_gpus <= set_gpus


# --- a node's guest network --------------------------------------------------------------------


def guest_bridge_problem(name: object) -> str:
    """Why ``name`` is not a Linux network interface name for a node's guest bridge, or ""."""
    if not isinstance(name, str):
        return f"must be text, got {name!r}"
    if name in (".", "..") or not re.match(INTERFACE_NAME, name):
        return (
            f"{name!r} is not a Linux interface name: 1-15 letters, digits, '.', '-' or '_', "
            "e.g. gpubr0"
        )
    return ""


def guest_subnet_problem(subnet: object) -> str:
    """Why ``subnet`` cannot be a node's guest subnet, or "". It is an IPv4 network in CIDR
    form with room for the gateway (its first address) and at least one guest."""
    if not isinstance(subnet, str):
        return f"must be text, got {subnet!r}"
    try:
        network = ipaddress.ip_network(subnet, strict=False)
    except ValueError:
        return f"{subnet!r} is not an IPv4 subnet in CIDR form, e.g. 10.200.0.0/24"
    if network.version != 4 or "/" not in subnet:
        return f"{subnet!r} is not an IPv4 subnet in CIDR form, e.g. 10.200.0.0/24"
    if str(network) != subnet:
        return f"{subnet!r} has host bits set; the subnet is {network}"
    if network.prefixlen > GUEST_PREFIX_MAX:
        return (
            f"/{network.prefixlen} has no room for a gateway and a guest; "
            f"use /{GUEST_PREFIX_MAX} or larger"
        )
    return ""


def guest_subnets_overlap(subnet: str, other: str) -> bool:
    """Whether two valid guest subnets share an address."""
    return ipaddress.ip_network(subnet).overlaps(ipaddress.ip_network(other))


def guest_network_problems(*, guest_bridge: str, guest_subnet: str) -> dict[str, str]:
    """A node's guest bridge and subnet, each checked, and together: a subnet needs a bridge."""
    problems = {}
    if guest_bridge:
        problem = guest_bridge_problem(guest_bridge)
        if problem:
            problems["guest_bridge"] = problem
    if guest_subnet:
        problem = guest_subnet_problem(guest_subnet)
        if problem:
            problems["guest_subnet"] = problem
        elif not guest_bridge and "guest_bridge" not in problems:
            problems["guest_bridge"] = (
                "is required with a guest_subnet: the bridge its guests' interfaces join"
            )
    return problems
