"""NVIDIA's ``nv-partitioner -o 0`` listing (its table, or its CSV with ``-f csv``) read into
``FabricPartition`` rows (see ``fabric_manager``). Rows whose status is ``UNSUPPORTED``, or
that follow a heading that says "unsupported", are kept with ``supported=False``; anything that
cannot be read is a ``FabricListingError`` naming the line and why."""

import csv
import re
from dataclasses import dataclass

from gpucap.drivers.base import DriverError


class FabricListingError(DriverError):
    """A partition listing that cannot be read; the message names the line and why."""


@dataclass(frozen=True)
class FabricPartition:
    """One partition as Fabric Manager lists it."""

    id: int
    modules: tuple[int, ...]  # GPU module (physical) ids, as listed
    active: bool = False
    supported: bool = True
    max_nvlinks: int | None = None

    def describe(self) -> str:
        """'partition 3 (modules 1, 3)'."""
        return f"partition {self.id} (modules {', '.join(map(str, self.modules))})"


_TOTAL = re.compile(r"^\s*Total supported partitions:\s*(\d+)\s*$", re.IGNORECASE)
_TABLE_HEADER = re.compile(r"^\s*Partition ID\b", re.IGNORECASE)
_CSV_HEADER = re.compile(r"^\s*Partition_ID\s*,", re.IGNORECASE)
# 3   2   1, 3   18   INACTIVE   (the interactive tool writes the status as "(INACTIVE)")
_TABLE_ROW = re.compile(
    r"^\s*(?P<id>\d+)\s+(?P<gpus>\d+)\s+(?P<modules>N/A|\d+(?:\s*,\s*\d+)*)"
    r"\s+(?P<nvlinks>\d+)(?:\s+\(?(?P<status>[A-Za-z_]+)\)?)?\s*$"
)
_STATUSES = {"ACTIVE": (True, True), "INACTIVE": (False, True), "UNSUPPORTED": (False, False)}
_COLUMNS = "Partition ID, Number of GPUs, GPU Module ID, Max NVLinks/GPU, STATUS"


def partitions_parse(text: str) -> list[FabricPartition]:
    """The partitions of an ``nv-partitioner -o 0`` listing (table or CSV), in listed order.
    Raises ``FabricListingError`` naming the line for anything it cannot read: a listing that
    is cut short or garbled must never become a partition table."""
    lines = text.splitlines()
    start = next(
        (n for n, line in enumerate(lines) if _TABLE_HEADER.match(line) or _CSV_HEADER.match(line)),
        None,
    )
    if start is None:
        first = next((line.strip() for line in lines if line.strip()), "(empty)")
        raise FabricListingError(
            "no partition table in the listing: expected nv-partitioner -o 0 output with a "
            f"'Partition ID' header; it begins {first[:200]!r}"
        )
    if _CSV_HEADER.match(lines[start]):
        partitions = _csv_rows(lines, start)
    else:
        partitions = _table_rows(lines, start)
    if not partitions:
        raise FabricListingError("the listing has a header but no partitions")
    _check_listing(partitions, lines)
    return partitions


def _table_rows(lines: list[str], start: int) -> list[FabricPartition]:
    partitions = []
    supported = True
    for number, line in enumerate(lines[start + 1 :], start=start + 2):
        stripped = line.strip()
        if not stripped or set(stripped) <= {"-", "=", "+", "|"} or _TABLE_HEADER.match(line):
            continue
        match = _TABLE_ROW.match(line)
        if match is None:
            if not stripped[0].isdigit() and "unsupported" in stripped.lower():
                supported = False  # a heading: what follows is what Fabric Manager cannot do
                continue
            raise FabricListingError(
                f"line {number}: cannot read {stripped[:200]!r} as a partition ({_COLUMNS})"
            )
        partitions.append(
            _partition(
                number,
                id=match["id"],
                gpus=match["gpus"],
                modules=[] if match["modules"] == "N/A" else match["modules"].split(","),
                nvlinks=match["nvlinks"],
                status=match["status"],
                supported=supported,
            )
        )
    return partitions


def _csv_rows(lines: list[str], start: int) -> list[FabricPartition]:
    partitions = []
    reader = csv.reader(lines[start + 1 :])
    for number, row in enumerate(reader, start=start + 2):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 5:
            raise FabricListingError(
                f"line {number}: {len(row)} columns, expected 5 ({_COLUMNS}): {','.join(row)!r}"
            )
        modules = row[2].replace(",", " ").split()
        partitions.append(
            _partition(
                number,
                id=row[0],
                gpus=row[1],
                modules=[] if modules == ["N/A"] else modules,
                nvlinks=row[3],
                status=row[4],
                supported=True,
            )
        )
    return partitions


def _partition(
    number: int,
    *,
    id: str,
    gpus: str,
    modules: list[str],
    nvlinks: str,
    status: str | None,
    supported: bool,
) -> FabricPartition:
    try:
        values = [int(id), int(gpus), int(nvlinks), *(int(m) for m in modules)]
    except ValueError:
        raise FabricListingError(
            f"line {number}: partition id, GPU count, module ids and NVLinks must be whole "
            f"numbers (got {id!r}, {gpus!r}, {' '.join(modules)!r}, {nvlinks!r})"
        ) from None
    partition_id, gpu_count, max_nvlinks, *module_ids = values
    state = (status or "INACTIVE").strip().upper()
    if state not in _STATUSES:
        raise FabricListingError(
            f"line {number}: partition {partition_id} has status {status!r}; expected one of "
            f"{', '.join(_STATUSES)}"
        )
    active, status_supported = _STATUSES[state]
    if gpu_count != len(module_ids):
        raise FabricListingError(
            f"line {number}: partition {partition_id} says {gpu_count} GPUs but lists "
            f"{len(module_ids)} module ids"
        )
    if len(set(module_ids)) != len(module_ids):
        raise FabricListingError(
            f"line {number}: partition {partition_id} lists a GPU module twice: {module_ids}"
        )
    return FabricPartition(
        id=partition_id,
        modules=tuple(module_ids),
        active=active,
        supported=supported and status_supported,
        max_nvlinks=max_nvlinks,
    )


def _check_listing(partitions: list[FabricPartition], lines: list[str]) -> None:
    seen: set[int] = set()
    for partition in partitions:
        if partition.id in seen:
            raise FabricListingError(f"partition {partition.id} is listed twice")
        seen.add(partition.id)
    totals = [int(match[1]) for line in lines if (match := _TOTAL.match(line))]
    listed = sum(1 for partition in partitions if partition.supported)
    if totals and totals[0] != listed:
        raise FabricListingError(
            f"the listing says {totals[0]} supported partitions but lists {listed}; "
            "was it cut short?"
        )
