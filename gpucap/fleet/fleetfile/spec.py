"""What a fleet file declares, once read and checked (frozen specs), and what applying it did
(changes and the result). ``where`` is an item's place in the file, e.g.
"clusters[0].nodes[3] (h100-004)"."""

from dataclasses import dataclass

from gpucap.fleet.fleetfile.sections import SectionSpec, plural_of

FORMAT_VERSION = 1


class FleetFileError(Exception):
    """A fleet file that cannot be applied. ``problems`` holds one line per problem, each
    starting with the file's path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


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
    module_id: int | None = None  # None: leave the card's module id as it is
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
    guest_bridge: str = ""
    guest_subnet: str = ""  # "": the node's driver gives guests addresses
    dedicated_to: str | None = None  # a tenant's slug; None: shared


@dataclass(frozen=True)
class CapacitySetSpec:
    where: str
    name: str
    cluster: str
    gpu_model: str
    fabric: str
    notice_seconds: int
    # The sections apps above the fleet add to a set (its schedule: `sections`), as given.
    sections: tuple[SectionSpec, ...] = ()


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
    protect_seconds: int
    tenants: tuple[str, ...]


@dataclass(frozen=True)
class ImageSpec:
    where: str
    name: str
    cluster: str
    base_image: str
    node_paths: dict
    default_user: str
    ports: tuple[int, ...]
    health_path: str
    description: str
    enabled: bool

    def fields(self) -> dict:
        """What ``image_create`` / ``image_update`` take besides the cluster and name."""
        return {
            "base_image": self.base_image,
            "node_paths": dict(self.node_paths),
            "default_user": self.default_user,
            "ports": list(self.ports),
            "health_path": self.health_path,
            "description": self.description,
            "enabled": self.enabled,
        }


@dataclass(frozen=True)
class FleetFile:
    source: str
    tenants: tuple[TenantSpec, ...] = ()
    operators: tuple[OperatorSpec, ...] = ()
    clusters: tuple[ClusterSpec, ...] = ()
    nodes: tuple[NodeSpec, ...] = ()
    capacity_sets: tuple[CapacitySetSpec, ...] = ()
    pools: tuple[PoolSpec, ...] = ()
    images: tuple[ImageSpec, ...] = ()
    sections: tuple[SectionSpec, ...] = ()  # the top-level sections apps add (quotas)


@dataclass(frozen=True)
class Change:
    verb: str  # "create", "update" or "delete" (a row of a set's section, `sections`)
    noun: str
    label: str
    detail: str

    def line(self, *, dry_run: bool) -> str:
        verb = f"would {self.verb}" if dry_run else self.verb
        return f"{verb} {self.noun} {self.label}: {self.detail}"


_NOUNS = (
    "tenant",
    "user",
    "membership",
    "operator",
    "cluster",
    "capacity set",
    "node",
    "pool",
    "image",
)


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
        for verb in ("create", "update", "delete"):
            counts = dict.fromkeys(_NOUNS, 0)
            for change in self.changes:
                if change.verb == verb:
                    counts[change.noun] = counts.get(change.noun, 0) + 1
            counted = [_plural(n, noun) for noun, n in counts.items() if n]
            if counted:
                done = f"would {verb}" if self.dry_run else f"{verb}d"
                parts.append(f"{done} {_and_list(counted)}")
        if not parts:
            parts.append("nothing to change")
        parts.append(f"unchanged {self.unchanged}")
        summary = ", ".join(parts)
        return f"dry run, nothing written: {summary}" if self.dry_run else summary


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {plural_of(noun)}"


def _and_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
