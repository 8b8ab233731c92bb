"""Drivers under test: a simulated fleet in a Redis namespace of its own per test, and libvirt
against its built-in test hypervisor, fresh for each test."""

import uuid

import pytest

from gpucap.drivers import libvirt as libvirt_driver
from gpucap.drivers import libvirt_host
from gpucap.drivers.base import GpuDevice, VmSpec
from gpucap.drivers.libvirt import LibvirtDriver
from gpucap.drivers.simulated import SimulatedDriver

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpucGNhcHRlc3RrZXk mallory@laptop"
H100_GPUS = (
    GpuDevice(index=0, uuid="GPU-0f6a1c2e-0000-4000-8000-000000000000", pci_address="0000:18:00.0"),
    GpuDevice(index=7, uuid="GPU-0f6a1c2e-0000-4000-8000-000000000007", pci_address="0000:db:00.0"),
)
LIBVIRT_TEST_SETTINGS = {
    "uri": "test:///default",
    "storage_pool": "default-pool",  # the test hypervisor's only pool (100 GiB)
    "disk_gib": 1,
    "grace_seconds": 0.3,
    "poll_seconds": 0.02,
}


def vm_spec(instance_id: str = "vm-42", *, node: str = "h100-001", **changes) -> VmSpec:
    fields = {
        "instance_id": instance_id,
        "node": node,
        "gpus": H100_GPUS,
        "image": "ubuntu-24.04-cuda-12.6",
        "ssh_public_key": SSH_KEY,
    }
    return VmSpec(**{**fields, **changes})


@pytest.fixture
def sim_namespace():
    """A fleet of this test's own, so parallel test runs never meet; emptied afterwards."""
    namespace = f"test-{uuid.uuid4().hex}"
    yield namespace
    SimulatedDriver(namespace=namespace).reset()


@pytest.fixture
def simulated(sim_namespace):
    """Build simulated drivers (as each task would) over this test's fleet."""

    def build(**settings) -> SimulatedDriver:
        return SimulatedDriver({"boot_seconds": 0, **settings}, namespace=sim_namespace)

    return build


@pytest.fixture
def uploads(monkeypatch) -> dict[str, bytes]:
    """What the driver uploaded into volumes, by volume name. The test hypervisor cannot upload
    (``virStorageVolUpload`` is not supported by it), so this one call is recorded instead; the
    real upload runs against a real libvirtd in tests/realguest."""
    written: dict[str, bytes] = {}
    monkeypatch.setattr(
        libvirt_host,
        "volume_write",
        lambda connection, volume, data: written.__setitem__(volume.name(), data),
    )
    return written


@pytest.fixture
def hypervisor(uploads):
    """A fresh libvirt test hypervisor: its domains live in the connection, and the driver keeps
    one connection per URI, so dropping the cached ones starts from its default state."""
    libvirt_driver.connections_close()
    yield LibvirtDriver(LIBVIRT_TEST_SETTINGS)
    libvirt_driver.connections_close()


def libvirt_connection():
    """The connection the driver uses, to look behind its back as an operator's virsh would."""
    return libvirt_host.connect(LIBVIRT_TEST_SETTINGS["uri"])
