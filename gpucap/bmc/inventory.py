"""What a BMC says a machine is: frozen dataclasses, plain Python (docs/bmc.md, Inventory).

``gpucap.bmc.redfish`` fills them from Redfish; discovery compares them with the fleet. GPU
health is already gpucap's word (``ok`` / ``failed``, as ``Gpu.Health``); ``bmc_health`` keeps
the BMC's own (``OK``, ``Warning``, ``Critical``) for the preview to show.
"""

from dataclasses import dataclass

OK = "ok"
FAILED = "failed"


@dataclass(frozen=True)
class CpuInventory:
    redfish_id: str
    model: str
    cores: int | None
    threads: int | None


@dataclass(frozen=True)
class NicInventory:
    redfish_id: str
    mac_address: str
    speed_mbps: int | None
    link_up: bool | None


@dataclass(frozen=True)
class GpuInventory:
    """One GPU as the BMC reports it. ``index`` is the host's: the GPUs in PCI address order,
    as ``nvidia-smi`` numbers them by default."""

    index: int
    redfish_id: str
    model: str
    manufacturer: str
    serial_number: str
    uuid: str  # "GPU-<uuid>", as nvidia-smi and gpucap's Gpu rows write it; "" when unknown
    pci_address: str | None  # "0000:18:00.0"; None when the BMC gives none
    health: str  # OK or FAILED
    bmc_health: str  # the BMC's Status.Health (or State, for an absent or offline card)
    slot: int | None  # the board slot (e.g. SXM 6), where the BMC gives its ordinal


@dataclass(frozen=True)
class SystemInventory:
    """One ComputerSystem: the machine, its CPUs, memory, NICs and GPUs (in index order)."""

    redfish_id: str
    manufacturer: str
    model: str
    serial_number: str
    uuid: str
    host_name: str
    power_state: str  # "on", "off", "powering on", ... (sushy's words); "" when unknown
    cpus: tuple[CpuInventory, ...]
    memory_gib: float | None
    nics: tuple[NicInventory, ...]
    gpus: tuple[GpuInventory, ...]

    @property
    def failed_gpus(self) -> tuple[GpuInventory, ...]:
        return tuple(gpu for gpu in self.gpus if gpu.health == FAILED)
