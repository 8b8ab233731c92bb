"""What a VM can be given on a node (DESIGN.md section 2).

PCIe sets hand out single cards. NVSwitch sets hand out whole NVLink partitions, taken from the
node's partition table as Fabric Manager lists it. The default table of an 8-GPU baseboard is
{0..7}; {0..3}, {4..7}; {0,1}, {2,3}, {4,5}, {6,7}; and each GPU alone. A node with fewer GPUs
gets the same power-of-two table cut to its size (4 GPUs: {0..3}; {0,1}, {2,3}; singles). When
a node carries its own table only that table counts: 2-GPU partitions on real HGX boards are not
always adjacent indices, and guessing them by arithmetic breaks NVLink inside the guest.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

from gpucap.arbiter.model import Node

Partition = tuple[int, ...]

# The sizes of an NVLink partition, and so the block sizes a VM or demand may ask for, per
# fabric. This is the only place they are written down: fleet, rentals and plans ask here.
NVLINK_PARTITION_SIZES = (1, 2, 4, 8)
BLOCK_SIZES = {"pcie": (1,), "nvswitch": NVLINK_PARTITION_SIZES}

# Where each block size counts in a best-fit key (planner, search): breaking a free 8 weighs
# most.
FIT_SLOT = {size: slot for slot, size in enumerate(sorted(NVLINK_PARTITION_SIZES, reverse=True))}


def block_sizes(fabric: str) -> tuple[int, ...]:
    """The GPU counts a VM may have in a set of this fabric."""
    return BLOCK_SIZES[fabric]


def ready_shared_gpus(nodes: Iterable[Node]) -> int:
    """The working GPUs of the ready nodes not dedicated to a tenant: what reservations can be
    honoured from (issue 19). A node going down, cordoned or losing a GPU lowers it."""
    return sum(
        node.gpus - len(node.failed_gpus)
        for node in nodes
        if node.state == "ready" and node.tenant is None
    )


def gpu_count_problem(fabric: str, gpu_count: int) -> str | None:
    """Why a VM or demand of ``gpu_count`` GPUs cannot exist in a set of this fabric, or None."""
    if gpu_count < 1:
        return f"must be at least 1 GPU, got {gpu_count}"
    if fabric == "pcie":
        if gpu_count != 1:
            return (
                f"{gpu_count} GPUs cannot be given in a PCIe set: PCIe sets allocate single "
                f"cards, so every VM has exactly 1 GPU"
            )
        return None
    if gpu_count not in BLOCK_SIZES["nvswitch"]:
        return (
            f"{gpu_count} GPUs is not an NVLink partition size: NVSwitch sets allocate whole "
            f"partitions of 1, 2, 4 or 8 GPUs"
        )
    return None


@lru_cache(maxsize=16)
def default_partitions(gpus: int) -> tuple[Partition, ...]:
    """The default NVSwitch table for a node with ``gpus`` GPUs, largest partitions first."""
    table = []
    for size in sorted(NVLINK_PARTITION_SIZES, reverse=True):
        if size <= gpus:
            table.extend(
                tuple(range(start, start + size)) for start in range(0, gpus - size + 1, size)
            )
    return tuple(table)


@lru_cache(maxsize=16)
def single_cards(gpus: int) -> tuple[Partition, ...]:
    return tuple((index,) for index in range(gpus))


def partition_table(node: Node, fabric: str) -> tuple[Partition, ...]:
    """Every block a VM may hold on this node, as sorted GPU-index tuples, in table order."""
    if fabric == "pcie":
        return single_cards(node.gpus)
    if node.partitions is not None:
        return node.partitions
    return default_partitions(node.gpus)


def node_partitions(
    *, fabric: str, gpu_count: int, partitions: Sequence[Sequence[int]] | None
) -> tuple[Partition, ...]:
    """`partition_table` from plain data, for callers that hold a node's fields rather than an
    arbiter `Node`: a node's own table (``partitions``; empty or None for the default one)."""
    if fabric == "pcie":
        return single_cards(gpu_count)
    if partitions:
        return tuple(tuple(sorted(block)) for block in partitions)
    return default_partitions(gpu_count)


def placeable_partitions(node: Node, fabric: str, size: int) -> list[Partition]:
    """Partitions of ``size`` GPUs that may take a new placement: none on a node that is not
    ready, and none that contains a failed GPU. Occupancy is not considered here."""
    if node.state != "ready":
        return []
    failed = gpu_mask(node.failed_gpus)
    return [
        block
        for block in partition_table(node, fabric)
        if len(block) == size and not gpu_mask(block) & failed
    ]


def gpu_mask(gpus: Iterable[int]) -> int:
    """A set of GPU indices as a bit mask (bit i = GPU i)."""
    mask = 0
    for index in gpus:
        mask |= 1 << index
    return mask


# --- checking a partition table -----------------------------------------------------------------
# Two readers word the same rules for their own audience: an operator entering a node's table
# (fleet services and fleet files) and a snapshot file (`validation`).


def partition_table_problems(
    partitions: object, gpu_count: int, *, names: Sequence[str] | None = None
) -> list[str]:
    """What is wrong with a partition table an operator entered for a node of ``gpu_count``
    GPUs (empty: nothing).

    A table lists NVLink partitions as lists of GPU indices, as Fabric Manager reports them.
    Each partition has 1, 2, 4 or 8 distinct GPUs of the node, and no partition is listed twice.
    ``names`` words each partition for its reader (a Fabric Manager import names Fabric
    Manager's partition ids); by default partitions are numbered from 1.
    """
    if not isinstance(partitions, list) or not partitions:
        return ["must be a non-empty list of partitions (lists of GPU indices)"]
    problems = []
    seen = set()
    for position, block in enumerate(partitions):
        label = names[position] if names is not None else f"partition {position + 1}"
        if not isinstance(block, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in block
        ):
            problems.append(f"{label} must be a list of GPU indices")
            continue
        if not _is_partition_size(len(block)) or len(block) > gpu_count:
            problems.append(
                f"{label} {block} has {len(block)} GPUs; a partition has 1, 2, 4 or 8 GPUs "
                f"and at most the node's {gpu_count}"
            )
        out_of_range = _out_of_range(block, gpu_count)
        if out_of_range:
            problems.append(
                f"{label} {block} names GPU {out_of_range[0]}, outside 0..{gpu_count - 1}"
            )
        if _names_a_gpu_twice(block):
            problems.append(f"{label} {block} names a GPU twice")
        key = tuple(sorted(block))
        if key in seen:
            problems.append(f"{label} {block} is listed twice")
        seen.add(key)
    return problems


def snapshot_table_problems(partitions: Iterable[Sequence[int]], gpu_count: int) -> list[str]:
    """What is wrong with a node's partition table in a snapshot: at most one problem a
    partition, named by its place in the file (``partitions[2] [0, 1, 2]``)."""
    problems = []
    seen: set[tuple[int, ...]] = set()
    for position, block in enumerate(partitions):
        where = f"partitions[{position}] {list(block)}"
        if not block:
            problems.append(f"{where} is empty")
            continue
        if _out_of_range(block, gpu_count):
            problems.append(f"{where} out of range for a node with {gpu_count} GPUs")
        elif _names_a_gpu_twice(block):
            problems.append(f"{where} lists a GPU twice")
        elif not _is_partition_size(len(block)):
            problems.append(f"{where} has {len(block)} GPUs; partitions have 1, 2, 4 or 8")
        elif tuple(sorted(block)) in seen:
            problems.append(f"{where} appears twice in the table")
        seen.add(tuple(sorted(block)))
    return problems


def _is_partition_size(gpus: int) -> bool:
    return gpus in NVLINK_PARTITION_SIZES


def _out_of_range(block: Sequence[int], gpu_count: int) -> list[int]:
    return [index for index in block if not 0 <= index < gpu_count]


def _names_a_gpu_twice(block: Sequence[int]) -> bool:
    return len(set(block)) != len(block)
