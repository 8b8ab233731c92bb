"""The libvirt driver's settings (a cluster's ``driver_settings``), each checked by name when a
cluster is saved: see docs/drivers.md for what each one does."""

import string
from dataclasses import dataclass, field

from gpucap.drivers.fabric_manager import DEFAULT_COMMAND, command_problem, fabric_manager_problem
from gpucap.drivers.libvirt_xml import DomainShape


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


@dataclass(frozen=True)
class LibvirtSettings:
    uri: str = field(
        metadata={
            "example": "qemu+ssh://root@{node}/system",
            "check": template_check(allowed={"node"}),
        }
    )
    vcpus_per_gpu: int = field(default=8, metadata={"minimum": 1})
    memory_gib_per_gpu: int = field(default=64, metadata={"minimum": 1})
    image_path: str = field(
        default="/var/lib/gpucap/images/{image}.qcow2",
        metadata={"check": template_check(allowed={"image"}, required=frozenset({"image"}))},
    )
    storage_pool: str = "gpucap"  # a dir pool on every node, e.g. /var/lib/gpucap/vms
    disk_gib: int = field(default=100, metadata={"minimum": 1})
    network: str = "default"
    domain_type: str = "kvm"
    machine: str = "q35"
    firmware: str = field(default="efi", metadata={"check": one_of("efi", "bios")})
    grace_seconds: float = field(default=30.0, metadata={"minimum": 0})
    poll_seconds: float = field(default=1.0, metadata={"minimum": 0.01})
    # How long the hypervisor watch waits for a node's libvirt to say its version.
    probe_timeout_seconds: float = field(default=10.0, metadata={"minimum": 0.1})
    # False leaves the GPUs out of every domain: for rigs with no GPUs to pass (CI, a lab), so
    # everything else runs for real. Never on a production cluster; its page says so.
    gpu_passthrough: bool = True
    # Images shipped as a kernel and an initrd boot them directly (templates on {image}).
    kernel_path: str = field(
        default="", metadata={"check": template_check(allowed={"image"}, empty=True)}
    )
    initrd_path: str = field(
        default="", metadata={"check": template_check(allowed={"image"}, empty=True)}
    )
    kernel_cmdline: str = "console=ttyS0"
    # Each guest's serial console to a file on its node ({instance}); empty: a pty.
    serial_log_path: str = field(
        default="", metadata={"check": template_check(allowed={"instance"}, empty=True)}
    )
    # Shared-NVSwitch nodes: who activates a VM's NVLink partition (see fabric_manager).
    fabric_manager: str = field(default="none", metadata={"check": fabric_manager_problem})
    fabric_manager_command: list = field(
        default_factory=lambda: list(DEFAULT_COMMAND), metadata={"check": command_problem}
    )
    fabric_manager_timeout_seconds: float = field(default=60.0, metadata={"minimum": 1})

    @property
    def shape(self) -> DomainShape:
        return DomainShape(
            vcpus_per_gpu=self.vcpus_per_gpu,
            memory_gib_per_gpu=self.memory_gib_per_gpu,
            domain_type=self.domain_type,
            machine=self.machine,
            firmware=self.firmware,
            network=self.network,
            gpu_passthrough=self.gpu_passthrough,
            kernel=self.kernel_path,
            initrd=self.initrd_path,
            cmdline=self.kernel_cmdline if self.kernel_path else "",
            serial_log=self.serial_log_path,
        )
