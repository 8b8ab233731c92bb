"""Checks of an NVSwitch node's partition table as an operator enters it."""

BLOCK_SIZES = (1, 2, 4, 8)


def partition_table_problems(partitions: object, gpu_count: int) -> list[str]:
    """What is wrong with a partition table for a node of ``gpu_count`` GPUs (empty: nothing).

    A table lists NVLink partitions as lists of GPU indices, as Fabric Manager reports them.
    Each partition has 1, 2, 4 or 8 distinct GPUs of the node, and no partition is listed twice.
    """
    if not isinstance(partitions, list) or not partitions:
        return ["must be a non-empty list of partitions (lists of GPU indices)"]
    problems = []
    seen = set()
    for position, block in enumerate(partitions):
        label = f"partition {position + 1}"
        if not isinstance(block, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in block
        ):
            problems.append(f"{label} must be a list of GPU indices")
            continue
        if len(block) not in BLOCK_SIZES or len(block) > gpu_count:
            problems.append(
                f"{label} {block} has {len(block)} GPUs; a partition has 1, 2, 4 or 8 GPUs "
                f"and at most the node's {gpu_count}"
            )
        out_of_range = [i for i in block if not 0 <= i < gpu_count]
        if out_of_range:
            problems.append(
                f"{label} {block} names GPU {out_of_range[0]}, outside 0..{gpu_count - 1}"
            )
        if len(set(block)) != len(block):
            problems.append(f"{label} {block} names a GPU twice")
        key = tuple(sorted(block))
        if key in seen:
            problems.append(f"{label} {block} is listed twice")
        seen.add(key)
    return problems
