"""The libvirt driver and Fabric Manager on libvirt's test hypervisor: a VM's NVLink partition is
activated before its domain starts and deactivated once the domain is off, and two partitions
that share a GPU are never active on one node at once."""

import itertools
import xml.etree.ElementTree as ET

import libvirt
import pytest

from gpucap.drivers import fabric_manager
from gpucap.drivers import libvirt as libvirt_driver
from gpucap.drivers.base import DriverError, GpuDevice
from gpucap.drivers.fabric_manager import HGX_8_GPU_PARTITIONS, SimulatedFabricManager
from gpucap.drivers.libvirt import LibvirtDriver
from gpucap.drivers.libvirt_xml import METADATA_NAMESPACE, fabric_partition_of
from tests.drivers.conftest import LIBVIRT_TEST_SETTINGS, libvirt_connection, vm_spec

NODE = "h100-001"
MODULES = {p.id: set(p.modules) for p in HGX_8_GPU_PARTITIONS}


def gpus(*indices: int) -> tuple[GpuDevice, ...]:
    buses = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
    return tuple(
        GpuDevice(index=i, uuid=f"GPU-{i}", pci_address=f"0000:{buses[i]}:00.0") for i in indices
    )


@pytest.fixture
def timeline(monkeypatch):
    """What happened, in order: Fabric Manager calls (with which gpucap domains were running at
    that moment) and domains being powered on. After every Fabric Manager call it checks that no
    two active partitions of the node share a GPU."""
    events: list[tuple] = []

    def running() -> list[str]:
        domains = libvirt_connection().listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
        return sorted(d.name() for d in domains if d.name().startswith("vm-"))

    def recorded(verb, original):
        def call(self, partition_id):
            events.append((verb, partition_id, running()))
            original(self, partition_id)
            for one, other in itertools.combinations(self.active(), 2):
                assert not MODULES[one] & MODULES[other], (one, other)

        return call

    for verb in ("activate", "deactivate"):
        original = getattr(SimulatedFabricManager, verb)
        monkeypatch.setattr(SimulatedFabricManager, verb, recorded(verb, original))
    power_on = libvirt.virDomain.create

    def create(domain):
        events.append(("power on", domain.name()))
        return power_on(domain)

    monkeypatch.setattr(libvirt.virDomain, "create", create)
    return events


@pytest.fixture
def fabric_hypervisor(uploads):
    """The test hypervisor behind a libvirt driver whose cluster uses the simulated Fabric
    Manager; both start empty."""
    libvirt_driver.connections_close()
    fabric_manager.simulated_fabric_reset()
    yield LibvirtDriver({**LIBVIRT_TEST_SETTINGS, "fabric_manager": "simulated"})
    libvirt_driver.connections_close()
    fabric_manager.simulated_fabric_reset()


def active() -> set[int]:
    return SimulatedFabricManager(NODE).active()


def test_create_activates_the_partition_before_the_domain_starts(fabric_hypervisor, timeline):
    status = fabric_hypervisor.create(vm_spec("vm-1", gpus=gpus(0, 1, 2, 3), fabric_partition=1))

    assert status.state == "running"
    assert timeline == [("activate", 1, []), ("power on", "vm-1")]
    assert active() == {1}


def test_the_partition_is_recorded_in_the_domains_metadata(fabric_hypervisor):
    fabric_hypervisor.create(vm_spec("vm-2", gpus=gpus(0, 2), fabric_partition=3))
    xml = libvirt_connection().lookupByName("vm-2").XMLDesc()

    assert fabric_partition_of(xml) == 3
    assert (
        ET.fromstring(xml).findtext(
            "metadata/gpucap:instance/gpucap:fabric-partition",
            namespaces={"gpucap": METADATA_NAMESPACE},
        )
        == "3"
    )


def test_stop_deactivates_after_the_domain_is_off_and_start_activates_again(
    fabric_hypervisor, timeline
):
    fabric_hypervisor.create(vm_spec("vm-3", gpus=gpus(0, 1, 2, 3), fabric_partition=1))

    fabric_hypervisor.stop("vm-3", NODE)
    stopped = active()
    fabric_hypervisor.start("vm-3", NODE)

    assert timeline == [
        ("activate", 1, []),
        ("power on", "vm-3"),
        ("deactivate", 1, []),
        ("activate", 1, []),
        ("power on", "vm-3"),
    ]
    assert stopped == set()
    assert active() == {1}


def test_a_forced_stop_also_deactivates_once_the_domain_is_off(
    fabric_hypervisor, timeline, monkeypatch
):
    fabric_hypervisor.create(vm_spec("vm-4", gpus=gpus(4, 5, 6, 7), fabric_partition=2))
    monkeypatch.setattr(libvirt.virDomain, "shutdown", lambda domain: 0)  # a wedged guest

    status = fabric_hypervisor.stop("vm-4", NODE, grace_seconds=0.1)

    assert status.message.startswith("forced off")
    assert timeline[-1] == ("deactivate", 2, [])
    assert active() == set()


def test_destroy_deactivates_after_the_domain_is_off(fabric_hypervisor, timeline):
    fabric_hypervisor.create(vm_spec("vm-5", gpus=gpus(0, 2), fabric_partition=3))

    fabric_hypervisor.destroy("vm-5", NODE)
    fabric_hypervisor.destroy("vm-5", NODE)

    assert timeline[-1] == ("deactivate", 3, [])
    assert active() == set()


def test_an_overlapping_partition_is_refused_while_the_first_vm_runs_and_taken_after_it_stops(
    fabric_hypervisor, timeline
):
    fabric_hypervisor.create(vm_spec("vm-6", gpus=gpus(0, 1, 2, 3), fabric_partition=1))

    with pytest.raises(DriverError) as refused:
        fabric_hypervisor.create(vm_spec("vm-7", gpus=gpus(0, 2), fabric_partition=3))
    second_while_first_runs = fabric_hypervisor.status("vm-7", NODE).state
    fabric_hypervisor.stop("vm-6", NODE)
    retried = fabric_hypervisor.create(vm_spec("vm-7", gpus=gpus(0, 2), fabric_partition=3))

    assert str(refused.value) == (
        "Fabric Manager on h100-001 refused to activate partition 3 (modules 1, 3): "
        "GPU module 1, 3 is in active partition 1 (modules 1, 2, 3, 4)"
    )
    assert second_while_first_runs == "stopped"  # defined, never powered on
    assert ("power on", "vm-7") not in timeline[: timeline.index(("deactivate", 1, []))]
    assert retried.state == "running"
    assert active() == {3}


def test_stopping_a_long_stopped_vm_leaves_its_old_partition_to_the_vm_running_in_it(
    fabric_hypervisor,
):
    # A spot VM stopped by a reclaim keeps its domain (and records partition 1); an on-demand
    # VM then runs on the same GPUs in partition 1. The spot VM's owner terminates it.
    fabric_hypervisor.create(vm_spec("vm-8", gpus=gpus(0, 1, 2, 3), fabric_partition=1))
    fabric_hypervisor.stop("vm-8", NODE)
    fabric_hypervisor.create(vm_spec("vm-9", gpus=gpus(0, 1, 2, 3), fabric_partition=1))

    fabric_hypervisor.stop("vm-8", NODE)
    fabric_hypervisor.destroy("vm-8", NODE)

    assert active() == {1}
    assert fabric_hypervisor.status("vm-9", NODE).state == "running"


def test_a_multi_gpu_vm_without_a_partition_is_refused_rather_than_started_without_nvlink(
    fabric_hypervisor, timeline
):
    with pytest.raises(DriverError) as refused:
        fabric_hypervisor.create(vm_spec("vm-10", gpus=gpus(0, 1)))

    assert "vm-10 has 2 GPUs on h100-001 but no Fabric Manager partition" in str(refused.value)
    assert "fabric_partitions_import" in str(refused.value)
    assert ("power on", "vm-10") not in timeline


def test_a_cluster_without_fabric_manager_never_calls_it(hypervisor, timeline):
    hypervisor.create(vm_spec("vm-11", gpus=gpus(0, 2), fabric_partition=3))
    hypervisor.stop("vm-11", NODE)

    assert timeline == [("power on", "vm-11")]


def test_an_unknown_fabric_manager_setting_is_refused_by_name():
    with pytest.raises(DriverError, match="fabric_manager: must be one of none, simulated"):
        LibvirtDriver({**LIBVIRT_TEST_SETTINGS, "fabric_manager": "nvidia"})
