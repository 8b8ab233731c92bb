"""What a VM can be given on a node (DESIGN.md section 2).

PCIe sets hand out single cards. NVSwitch sets hand out whole NVLink partitions, taken from the
node's partition table as Fabric Manager lists it. The default table of an 8-GPU baseboard is
{0..7}; {0..3}, {4..7}; {0,1}, {2,3}, {4,5}, {6,7}; and each GPU alone. A node with fewer GPUs
gets the same power-of-two table cut to its size (4 GPUs: {0..3}; {0,1}, {2,3}; singles). When
a node carries its own table only that table counts: 2-GPU partitions on real HGX boards are not
always adjacent indices, and guessing them by arithmetic breaks NVLink inside the guest.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from gpucap.arbiter.model import BLOCK_SIZES, Node

Partition = tuple[int, ...]

# Where each block size counts in a best-fit key (planner, search): breaking a free 8 weighs
# most.
FIT_SLOT = {8: 0, 4: 1, 2: 2, 1: 3}


def block_sizes(fabric: str) -> tuple[int, ...]:
    """The GPU counts a VM may have in a set of this fabric."""
    return BLOCK_SIZES[fabric]


def gpu_count_problem(fabric: str, gpu_count: int) -> str | None:
    """Why a VM or demand of ``gpu_count`` GPUs cannot exist in a set of this fabric, or None."""
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
    for size in (8, 4, 2, 1):
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
