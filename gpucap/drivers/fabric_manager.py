"""NVIDIA Fabric Manager: the NVLink partitions of a Shared-NVSwitch HGX node (DESIGN.md
sections 2 and 10).

On such a node the NVSwitches are owned by Fabric Manager, and the GPUs of a multi-GPU VM talk
over NVLink only inside a partition Fabric Manager has ACTIVATED: before the VM starts, and
DEACTIVATED once it is off. Two partitions sharing a GPU are never active together; Fabric
Manager refuses the second one.

Fabric Manager names GPUs by module (physical) id, 1..8 on an HGX baseboard, not by the host's
GPU index; ``Gpu.module_id`` maps one to the other (see ``manage.py fabric_partitions_import``).

Here:

- ``partitions_parse`` (``fabric_listing``): NVIDIA's ``nv-partitioner -o 0`` listing read into
  ``FabricPartition`` rows.
- ``FabricManager``: the client interface the libvirt driver uses, one client per node.
- ``NvPartitionerClient``: runs the real tool through the cluster's command template, e.g.
  ``["ssh", "root@{node}", "nv-partitioner"]``.
- ``SimulatedFabricManager``: keeps the state in this process, per node, and refuses what a
  real Fabric Manager refuses.

Every call is idempotent: activating an active partition or deactivating an inactive one
succeeds without doing anything. Failing to reach Fabric Manager (a timeout, SSH failing, the
service not answering) is ``DriverUnavailable``; anything it refuses is ``DriverError`` with
the tool's own words.
"""

import os
import string
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from gpucap.drivers.base import DriverError, DriverUnavailable
from gpucap.drivers.fabric_listing import FabricListingError, FabricPartition, partitions_parse

# The ``fabric_manager`` driver setting: which client a cluster's nodes use.
NONE = "none"
SIMULATED = "simulated"
NV_PARTITIONER = "nv-partitioner"
FABRIC_MANAGERS = (NONE, SIMULATED, NV_PARTITIONER)

DEFAULT_COMMAND = ("ssh", "root@{node}", "nv-partitioner")

# How much of the tool's output a message quotes.
_MESSAGE_CHARS = 500


class FabricManager(Protocol):
    """Fabric Manager of one node."""

    node: str

    def partitions(self) -> list[FabricPartition]:
        """Every partition Fabric Manager lists, with whether it is active."""

    def activate(self, partition_id: int) -> None:
        """Activate a partition; nothing if it is active. Refused (``DriverError``) while a
        partition sharing a GPU with it is active."""

    def deactivate(self, partition_id: int) -> None:
        """Deactivate a partition; nothing if it is not active."""

    def active(self) -> set[int]:
        """The ids of the active partitions."""


def fabric_manager_for(
    kind: str, node: str, *, command: Sequence[str], timeout_seconds: float
) -> FabricManager | None:
    """The client for ``node`` of a cluster whose ``fabric_manager`` setting is ``kind``; None
    for ``none`` (a PCIe cluster, or NVSwitch nodes in bare-metal mode)."""
    if kind == NONE:
        return None
    if kind == SIMULATED:
        return SimulatedFabricManager(node)
    if kind == NV_PARTITIONER:
        return NvPartitionerClient(node, command=command, timeout_seconds=timeout_seconds)
    raise DriverError(f"unknown Fabric Manager {kind!r} (known: {', '.join(FABRIC_MANAGERS)})")


def fabric_manager_problem(kind: str) -> str:
    """Why ``kind`` is not a ``fabric_manager`` setting, or ""."""
    if kind in FABRIC_MANAGERS:
        return ""
    return f"must be one of {', '.join(FABRIC_MANAGERS)}, got {kind!r}"


def command_problem(command: list) -> str:
    """Why ``command`` is not a command template (a non-empty list of strings that may use
    ``{node}``), or ""."""
    if not command:
        return "must name the command to run, e.g. " + str(list(DEFAULT_COMMAND))
    for word in command:
        if not isinstance(word, str) or not word.strip():
            return f"every word must be a non-empty string, got {word!r}"
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(word) if name is not None}
        except ValueError as error:
            return f"{word!r} is not a valid template: {error}"
        unknown = sorted(names - {"node"})
        if unknown:
            return f"{word!r}: unknown placeholder {{{unknown[0]}}} (only {{node}})"
    return ""


# --- the real tool ---------------------------------------------------------------------------


class NvPartitionerClient:
    """NVIDIA's ``nv-partitioner`` sample tool, run through a command template (a list of
    words in which ``{node}`` is the node's hostname), with a timeout per call."""

    def __init__(self, node: str, *, command: Sequence[str], timeout_seconds: float) -> None:
        self.node = node
        self.command = [word.format(node=node) for word in command]
        self.timeout_seconds = timeout_seconds

    def partitions(self) -> list[FabricPartition]:
        output = self._run("-o", "0")
        try:
            return partitions_parse(output)
        except FabricListingError as error:
            raise DriverError(f"Fabric Manager on {self.node}: {error}") from error

    def active(self) -> set[int]:
        return {partition.id for partition in self.partitions() if partition.active}

    def activate(self, partition_id: int) -> None:
        if partition_id in self.active():
            return
        self._run("-o", "1", "-p", str(partition_id))

    def deactivate(self, partition_id: int) -> None:
        if partition_id not in self.active():
            return
        self._run("-o", "2", "-p", str(partition_id))

    def _run(self, *arguments: str) -> str:
        argv = [*self.command, *arguments]
        shown = " ".join(argv)
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=self.timeout_seconds,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DriverUnavailable(
                f"Fabric Manager on {self.node}: {shown} did not answer within "
                f"{self.timeout_seconds:g} s"
            ) from None
        except OSError as error:
            raise DriverError(
                f"Fabric Manager on {self.node}: cannot run {argv[0]}: {error.strerror or error}"
            ) from None
        said = _tool_message(done.stdout, done.stderr)
        if done.returncode == 0 and not _reports_failure(said):
            return done.stdout
        message = f"Fabric Manager on {self.node}: {shown} failed (exit {done.returncode})"
        message += f": {said}" if said else ""
        if _unreachable(argv[0], done.returncode, said):
            raise DriverUnavailable(message)
        raise DriverError(message)


def _tool_message(stdout: str, stderr: str) -> str:
    lines = [
        line.strip()
        for line in (stdout + "\n" + stderr).splitlines()
        if line.strip() and not line.strip().startswith("Successfully connected")
    ]
    text = " ".join(lines)
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


def _reports_failure(said: str) -> bool:
    # Some builds of the sample tool exit 0 after printing "Error: Failed to ...".
    return said.startswith("Error:") or "Error: Failed" in said


def _unreachable(program: str, returncode: int, said: str) -> bool:
    """Failing to reach Fabric Manager rather than being refused by it: SSH's own failure
    (exit 255), or the tool failing to connect to the service."""
    if os.path.basename(program) == "ssh" and returncode == 255:
        return True
    return "connect to fabric manager" in said.lower()


# --- the simulated one -----------------------------------------------------------------------

# An HGX H100 8-GPU baseboard as Fabric Manager lists it in Shared NVSwitch mode: all eight,
# two halves, the 2-GPU pairs of its NVLink topology (module ids, not host indices) and each
# GPU alone.
HGX_8_GPU_PARTITIONS: tuple[FabricPartition, ...] = tuple(
    FabricPartition(id=partition_id, modules=modules, max_nvlinks=18)
    for partition_id, modules in enumerate(
        [
            (1, 2, 3, 4, 5, 6, 7, 8),
            (1, 2, 3, 4),
            (5, 6, 7, 8),
            (1, 3),
            (2, 4),
            (5, 7),
            (6, 8),
            *((module,) for module in range(1, 9)),
        ]
    )
)

_simulated_lock = threading.Lock()
_simulated_active: dict[str, set[int]] = {}


class SimulatedFabricManager:
    """Fabric Manager in this process: which partitions are active, per node, over the
    partitions of ``listing`` (default: an HGX 8-GPU baseboard). Like the real one it refuses
    to activate a partition that shares a GPU with an active one, and an unknown id."""

    def __init__(self, node: str, listing: Sequence[FabricPartition] = HGX_8_GPU_PARTITIONS):
        self.node = node
        self.listing = {partition.id: partition for partition in listing}

    def partitions(self) -> list[FabricPartition]:
        active = self.active()
        return [replace(p, active=p.id in active) for p in self.listing.values()]

    def active(self) -> set[int]:
        with _simulated_lock:
            return set(_simulated_active.get(self.node, ()))

    def activate(self, partition_id: int) -> None:
        wanted = self._partition(partition_id)
        with _simulated_lock:
            active = _simulated_active.setdefault(self.node, set())
            if partition_id in active:
                return
            for other in sorted(active):
                shared = sorted(set(self.listing[other].modules) & set(wanted.modules))
                if shared:
                    raise DriverError(
                        f"Fabric Manager on {self.node} refused to activate {wanted.describe()}: "
                        f"GPU module {', '.join(map(str, shared))} is in active "
                        f"{self.listing[other].describe()}"
                    )
            active.add(partition_id)

    def deactivate(self, partition_id: int) -> None:
        self._partition(partition_id)
        with _simulated_lock:
            _simulated_active.get(self.node, set()).discard(partition_id)

    def _partition(self, partition_id: int) -> FabricPartition:
        partition = self.listing.get(partition_id)
        if partition is None:
            raise DriverError(
                f"Fabric Manager on {self.node} has no partition {partition_id} "
                f"(it lists {', '.join(map(str, sorted(self.listing)))})"
            )
        return partition


def simulated_fabric_reset() -> None:
    """Deactivate every simulated partition on every node (tests)."""
    with _simulated_lock:
        _simulated_active.clear()
