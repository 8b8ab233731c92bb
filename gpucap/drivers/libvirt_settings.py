"""The libvirt driver's settings (a cluster's ``driver_settings``), each checked by name when a
cluster is saved: see docs/drivers.md for what each one does."""

from dataclasses import dataclass, field

from gpucap.drivers.base import one_of, template_check
from gpucap.drivers.fabric_manager import DEFAULT_COMMAND, command_problem, fabric_manager_problem
from gpucap.drivers.libvirt_xml import DomainShape
from gpucap.drivers.tcp_probe import ProbeSettings


@dataclass(frozen=True)
class LibvirtSettings(ProbeSettings):
    """With the hypervisor probe's (``ProbeSettings``): by default the node's libvirt is asked
    for its version within ``probe_timeout_seconds``."""

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
