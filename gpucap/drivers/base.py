"""The VM driver interface (DESIGN.md section 10).

Every call is idempotent: creating a VM that exists, stopping a stopped VM or destroying a
missing one succeeds without changing anything. A driver raises ``DriverUnavailable`` for a
transient problem (the task retries with backoff) and ``DriverError`` for a permanent one (the
VM is marked failed with the message).

Timing: ``create`` and ``start`` return as soon as the hypervisor has started the VM, usually
``booting``; the caller polls ``status`` until it says ``running``. ``stop`` returns once the
VM is off: it waits for the guest to shut down, and forces it off after the grace period.

A driver is built from its cluster's ``driver_settings`` (see ``gpucap.drivers.registry``); a
setting it does not know, or a value of the wrong kind, is a ``DriverError`` naming the setting.
"""

import dataclasses
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, get_type_hints

T = TypeVar("T")

# What ``VmStatus.state`` may be.
MISSING = "missing"  # no such VM on that node
BOOTING = "booting"
RUNNING = "running"
STOPPING = "stopping"
STOPPED = "stopped"  # defined, off, disk kept
FAILED = "failed"  # crashed or could not start; ``message`` says why
VM_STATES = frozenset({MISSING, BOOTING, RUNNING, STOPPING, STOPPED, FAILED})


class DriverError(Exception):
    """A permanent failure: retrying will not help. The message is shown to people."""


class DriverUnavailable(DriverError):
    """A transient failure (host unreachable, timeout): the task retries with backoff."""


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    pci_address: str  # "0000:18:00.0"


@dataclass(frozen=True)
class GuestNetwork:
    """The guest's one interface, as gpucap assigned it from its node's guest subnet: its MAC,
    its address with the subnet's prefix (``10.200.0.18/24``), the gateway (the node's own
    address on the bridge), the name servers, and the node's guest bridge it plugs into."""

    mac: str
    address: str
    gateway: str = ""
    nameservers: tuple[str, ...] = ()
    bridge: str = ""


@dataclass(frozen=True)
class VmSpec:
    """What a driver needs to create a VM."""

    instance_id: str  # "vm-42": the domain name on the hypervisor
    node: str  # hostname of the GPU server
    gpus: tuple[GpuDevice, ...]
    image: str  # the catalogue image's name
    ssh_public_key: str
    role: str = "rental"  # or "inference_replica"
    user_data: str = ""  # the tenant's own cloud-init user-data, checked already
    # None: the node has no guest subnet and its hypervisor gives the address (the simulated
    # driver, libvirt's NAT network).
    network: GuestNetwork | None = None
    # Inference replicas: the TCP port the image's model server listens on (its endpoint).
    service_port: int | None = None
    # NVSwitch nodes: Fabric Manager's id for the NVLink partition made of ``gpus``, activated
    # before the VM starts and deactivated after it stops (see ``fabric_manager``).
    fabric_partition: int | None = None
    # The catalogue image's base on this node (a path or a storage volume name), which the VM's
    # qcow2 overlay backs onto; "" when the image is not in the catalogue (the driver's own
    # naming of ``image`` applies).
    base_image: str = ""


@dataclass(frozen=True)
class VmStatus:
    """What the hypervisor says about a VM. ``state`` is one of ``VM_STATES``."""

    state: str
    ip_address: str | None = None
    endpoint_url: str | None = None  # inference replicas: where the model server listens
    message: str = ""

    def __post_init__(self) -> None:
        if self.state not in VM_STATES:
            raise ValueError(f"unknown VM state {self.state!r}; one of {sorted(VM_STATES)}")


class Driver(Protocol):
    def create(self, spec: VmSpec) -> VmStatus:
        """Define and start the VM with the given GPUs, image and SSH key. If it exists, make
        sure it runs."""

    def stop(self, instance_id: str, node: str, *, grace_seconds: float | None = None) -> VmStatus:
        """Graceful shutdown; forced after ``grace_seconds`` (None: the cluster's setting).
        Returns once the VM is off."""

    def start(self, instance_id: str, node: str) -> VmStatus:
        """Start a stopped VM again (same GPUs, same disk)."""

    def destroy(self, instance_id: str, node: str) -> VmStatus:
        """Remove the VM and its definition; its disk is gone."""

    def status(self, instance_id: str, node: str) -> VmStatus:
        """What the hypervisor says now."""

    def hypervisor_answers(self, node: str) -> bool:
        """Whether the node's hypervisor answers now, within the driver's own timeout. Never
        raises: a hypervisor that cannot be reached, refuses, or is slower than the timeout
        does not answer. The hypervisor watch (``gpucap.bmc.hypervisor_watch``) marks a node
        down when it has not answered for long, and recovery waits for it after a power
        cycle."""


def settings_parse(kind: type[T], raw: Mapping[str, Any] | None, *, driver: str) -> T:
    """Read a driver's settings into ``kind``, a frozen dataclass whose fields are the known
    settings with their defaults. A field's metadata may give a ``minimum`` (numbers), a
    ``check`` (value -> problem or "") and an ``example`` (for a missing required setting).
    Every problem is reported at once, each naming its setting."""
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise DriverError(f"{driver} driver settings must be a mapping, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(kind)}
    hints = get_type_hints(kind)
    problems = [
        f"unknown setting {name!r} (known: {', '.join(sorted(fields))})"
        for name in raw
        if name not in fields
    ]
    values = {}
    for name, field in fields.items():
        if name not in raw:
            if (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                example = field.metadata.get("example", "")
                problems.append(f"{name} is required" + (f", e.g. {example!r}" if example else ""))
            continue
        value = raw[name]
        problem = _setting_problem(value, hints[name], field.metadata.get("minimum"))
        if not problem and "check" in field.metadata:
            problem = field.metadata["check"](value)
        if problem:
            problems.append(f"{name}: {problem}")
        else:
            values[name] = float(value) if hints[name] is float else value
    if problems:
        raise DriverError(f"{driver} driver settings: " + "; ".join(problems))
    return kind(**values)


def _setting_problem(value: Any, kind: type, minimum: float | None) -> str:
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        return f"must be {_KIND_NAMES.get(kind, kind.__name__)}, got {value!r}"
    if minimum is not None and value < minimum:
        return f"must be at least {minimum:g}, got {value!r}"
    return ""


_KIND_NAMES = {
    float: "a number",
    int: "a whole number",
    str: "a string",
    bool: "true or false",
    dict: "a mapping",
    list: "a list",
}


def template_check(
    *, allowed: set[str], required: frozenset[str] = frozenset(), empty: bool = False
):
    """A check for a setting that is a ``str.format`` template with these placeholders (or, if
    ``empty``, nothing: the feature is off)."""

    def problem(template: str) -> str:
        if empty and template == "":
            return ""
        if not template.strip():
            return "must not be empty"
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(template) if name}
        except ValueError as error:
            return f"is not a valid template: {error}"
        if names - allowed:
            unknown, known = sorted(names - allowed)[0], ", ".join(f"{{{n}}}" for n in allowed)
            return f"unknown placeholder {{{unknown}}} (it may use {known})"
        if required - names:
            return f"must contain {{{sorted(required - names)[0]}}}"
        return ""

    return problem


def one_of(*choices: str):
    def problem(value: str) -> str:
        return "" if value in choices else f"must be one of {', '.join(choices)}, got {value!r}"

    return problem
