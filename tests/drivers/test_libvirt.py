"""The libvirt driver against libvirt's own test hypervisor (``test:///default``): the domain
XML passes each GPU through at its PCI address, the lifecycle works and every call is harmless
twice, and libvirt's errors come back as the driver's errors."""

import io
import json
import re
import time
import xml.etree.ElementTree as ET

import libvirt
import pycdlib
import pytest

from gpucap.drivers import libvirt_host
from gpucap.drivers.base import (
    DriverError,
    DriverUnavailable,
    GpuDevice,
    GuestNetwork,
    VmStatus,
)
from gpucap.drivers.libvirt import LibvirtDriver
from gpucap.drivers.libvirt_xml import METADATA_NAMESPACE, DomainShape, domain_xml
from tests.drivers.conftest import (
    H100_GPUS,
    LIBVIRT_TEST_SETTINGS,
    SSH_KEY,
    libvirt_connection,
    vm_spec,
)

SHAPE = DomainShape(vcpus_per_gpu=8, memory_gib_per_gpu=64)


def hostdev_addresses(xml: str) -> list[dict[str, str]]:
    domain = ET.fromstring(xml)
    return [
        dict(hostdev.find("source/address").attrib) for hostdev in domain.findall("devices/hostdev")
    ]


def defined_xml(instance_id: str) -> str:
    """The domain as libvirt itself now holds it."""
    return libvirt_connection().lookupByName(instance_id).XMLDesc()


def domain_names() -> list[str]:
    return sorted(domain.name() for domain in libvirt_connection().listAllDomains())


def volume_names() -> list[str]:
    pool = libvirt_connection().storagePoolLookupByName("default-pool")
    return sorted(pool.listVolumes())


# --- the domain XML ----------------------------------------------------------------------------


def test_each_gpu_is_passed_through_at_its_pci_address():
    xml = domain_xml(
        vm_spec("vm-42"), shape=SHAPE, disk_path="/vms/vm-42.qcow2", image_path="/img/u.qcow2"
    )
    hostdevs = ET.fromstring(xml).findall("devices/hostdev")

    assert [h.attrib for h in hostdevs] == [
        {"mode": "subsystem", "type": "pci", "managed": "yes"},
        {"mode": "subsystem", "type": "pci", "managed": "yes"},
    ]
    assert hostdev_addresses(xml) == [
        {"domain": "0x0000", "bus": "0x18", "slot": "0x00", "function": "0x0"},
        {"domain": "0x0000", "bus": "0xdb", "slot": "0x00", "function": "0x0"},
    ]


def test_vcpus_and_memory_grow_with_the_gpus():
    one_gpu = vm_spec("vm-1", gpus=H100_GPUS[:1])
    shape = DomainShape(vcpus_per_gpu=12, memory_gib_per_gpu=96)

    one = ET.fromstring(domain_xml(one_gpu, shape=shape, disk_path="/d", image_path="/i"))
    two = ET.fromstring(domain_xml(vm_spec("vm-2"), shape=shape, disk_path="/d", image_path="/i"))

    assert (one.findtext("vcpu"), one.find("memory").attrib, one.findtext("memory")) == (
        "12",
        {"unit": "GiB"},
        "96",
    )
    assert (two.findtext("vcpu"), two.findtext("memory")) == ("24", "192")


def test_the_domain_is_named_for_the_vm_boots_its_own_disk_and_carries_the_ssh_key():
    domain = ET.fromstring(
        domain_xml(
            vm_spec("vm-42"),
            shape=SHAPE,
            disk_path="/var/lib/gpucap/vms/vm-42.qcow2",
            image_path="/var/lib/gpucap/images/ubuntu-24.04-cuda-12.6.qcow2",
        )
    )
    disk = domain.find("devices/disk")
    ns = {"gpucap": METADATA_NAMESPACE}

    assert domain.findtext("name") == "vm-42"
    assert disk.find("source").get("file") == "/var/lib/gpucap/vms/vm-42.qcow2"
    assert disk.find("backingStore/source").get("file") == (
        "/var/lib/gpucap/images/ubuntu-24.04-cuda-12.6.qcow2"
    )
    assert domain.findtext("metadata/gpucap:instance/gpucap:ssh-authorized-key", namespaces=ns) == (
        SSH_KEY
    )
    assert domain.find("features/acpi") is not None  # what a graceful stop presses


def test_markup_in_an_ssh_key_comment_stays_text(hypervisor):
    key = "ssh-ed25519 AAAAC3Nza <b>mallory</b> & </metadata><hostdev/>"

    hypervisor.create(vm_spec("vm-43", ssh_public_key=key))
    stored = ET.fromstring(defined_xml("vm-43"))

    assert (
        stored.findtext(
            "metadata/gpucap:instance/gpucap:ssh-authorized-key",
            namespaces={"gpucap": METADATA_NAMESPACE},
        )
        == key
    )
    assert len(stored.findall("devices/hostdev")) == 2


def test_a_malformed_pci_address_is_refused_by_name():
    spec = vm_spec("vm-1", gpus=(GpuDevice(index=0, uuid="GPU-x", pci_address="18:00.0"),))

    with pytest.raises(DriverError, match=r"GPU PCI address '18:00.0' is not of the form"):
        domain_xml(spec, shape=SHAPE, disk_path="/d", image_path="/i")


# --- the lifecycle on the test hypervisor ------------------------------------------------------


def test_create_defines_and_starts_the_domain_with_its_gpus(hypervisor):
    status = hypervisor.create(vm_spec("vm-42"))

    assert status.state == "running"
    assert status.ip_address  # the test hypervisor hands out a DHCP lease
    assert "vm-42" in domain_names()
    assert hostdev_addresses(defined_xml("vm-42")) == [
        {"domain": "0x0000", "bus": "0x18", "slot": "0x00", "function": "0x0"},
        {"domain": "0x0000", "bus": "0xdb", "slot": "0x00", "function": "0x0"},
    ]
    assert "vm-42.qcow2" in volume_names()


def test_create_stop_start_destroy_each_twice(hypervisor):
    creates = [hypervisor.create(vm_spec("vm-50")).state for _ in range(2)]
    after_creates = domain_names()
    stops = [hypervisor.stop("vm-50", "h100-001").state for _ in range(2)]
    stopped = hypervisor.status("vm-50", "h100-001")
    starts = [hypervisor.start("vm-50", "h100-001").state for _ in range(2)]
    running = hypervisor.status("vm-50", "h100-001")
    destroys = [hypervisor.destroy("vm-50", "h100-001") for _ in range(2)]

    assert creates == ["running", "running"]
    assert after_creates.count("vm-50") == 1
    assert stops == ["stopped", "stopped"]
    assert stopped == VmStatus(state="stopped")
    assert starts == ["running", "running"]
    assert running.state == "running"
    assert destroys == [VmStatus(state="missing")] * 2
    assert hypervisor.status("vm-50", "h100-001") == VmStatus(state="missing")
    assert "vm-50" not in domain_names()
    assert "vm-50.qcow2" not in volume_names()


def test_a_stopped_vm_keeps_its_disk_and_boots_with_the_gpus_it_holds_now(hypervisor):
    hypervisor.create(vm_spec("vm-60"))
    hypervisor.stop("vm-60", "h100-001")
    disk_before = ET.fromstring(defined_xml("vm-60")).find("devices/disk/source").get("file")
    moved = (GpuDevice(index=3, uuid="GPU-3", pci_address="0000:5d:00.0"),)

    status = hypervisor.create(vm_spec("vm-60", gpus=moved))
    xml = defined_xml("vm-60")

    assert status.state == "running"
    assert hostdev_addresses(xml) == [
        {"domain": "0x0000", "bus": "0x5d", "slot": "0x00", "function": "0x0"}
    ]
    assert ET.fromstring(xml).find("devices/disk/source").get("file") == disk_before
    assert volume_names().count("vm-60.qcow2") == 1


def test_a_guest_that_ignores_the_acpi_button_is_forced_off_after_the_grace_period(
    hypervisor, monkeypatch
):
    hypervisor.create(vm_spec("vm-70"))
    monkeypatch.setattr(libvirt.virDomain, "shutdown", lambda domain: 0)  # a wedged guest

    began = time.monotonic()
    status = hypervisor.stop("vm-70", "h100-001", grace_seconds=0.3)
    took = time.monotonic() - began

    assert status.state == "stopped"
    assert status.message == "forced off: the guest did not shut down within 0.3 s"
    assert 0.3 <= took < 5
    assert hypervisor.status("vm-70", "h100-001").state == "stopped"


def test_the_grace_period_defaults_to_the_cluster_setting(hypervisor, monkeypatch):
    hypervisor.create(vm_spec("vm-71"))
    monkeypatch.setattr(libvirt.virDomain, "shutdown", lambda domain: 0)

    status = hypervisor.stop("vm-71", "h100-001")

    assert status.message == "forced off: the guest did not shut down within 0.3 s"


def test_status_reports_a_paused_domain_as_running_with_a_message(hypervisor):
    hypervisor.create(vm_spec("vm-72"))
    libvirt_connection().lookupByName("vm-72").suspend()

    status = hypervisor.status("vm-72", "h100-001")

    assert (status.state, status.message) == ("running", "paused by the hypervisor")


@pytest.mark.parametrize(
    ("state", "reason", "expected"),
    [
        (libvirt.VIR_DOMAIN_RUNNING, 0, ("running", "")),
        (libvirt.VIR_DOMAIN_PAUSED, libvirt.VIR_DOMAIN_PAUSED_STARTING_UP, ("booting", "")),
        (libvirt.VIR_DOMAIN_SHUTDOWN, 0, ("stopping", "")),
        (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTOFF_SHUTDOWN, ("stopped", "")),
        (
            libvirt.VIR_DOMAIN_SHUTOFF,
            libvirt.VIR_DOMAIN_SHUTOFF_CRASHED,
            ("failed", "the guest crashed"),
        ),
        (libvirt.VIR_DOMAIN_CRASHED, 0, ("failed", "the guest crashed")),
    ],
)
def test_libvirt_states_map_to_vm_states(state, reason, expected):
    assert libvirt_host.vm_state(state, reason) == expected


def test_starting_a_vm_that_was_never_created_is_an_error(hypervisor):
    with pytest.raises(DriverError, match="vm-404 is not defined on h100-001; create it first"):
        hypervisor.start("vm-404", "h100-001")
    assert hypervisor.stop("vm-404", "h100-001") == VmStatus(state="missing")


def test_a_new_driver_object_sees_the_vms_of_the_last(hypervisor):
    hypervisor.create(vm_spec("vm-80"))

    assert LibvirtDriver(LIBVIRT_TEST_SETTINGS).status("vm-80", "h100-001").state == "running"


def test_a_dropped_connection_is_replaced_on_the_next_call(hypervisor):
    libvirt_connection().close()

    # A new connection to the test hypervisor is a fresh hypervisor: the VM can be created.
    assert hypervisor.create(vm_spec("vm-81")).state == "running"


# --- errors ------------------------------------------------------------------------------------


def test_an_unreachable_hypervisor_is_a_transient_error():
    driver = LibvirtDriver({**LIBVIRT_TEST_SETTINGS, "uri": "qemu+tcp://127.0.0.1:1/system"})

    with pytest.raises(
        DriverUnavailable,
        match=re.escape("cannot connect to libvirt at qemu+tcp://127.0.0.1:1/system"),
    ):
        driver.status("vm-1", "h100-001")
    with pytest.raises(DriverUnavailable):
        driver.create(vm_spec("vm-1"))


def test_the_uri_template_names_the_node():
    driver = LibvirtDriver({"uri": "qemu+ssh://root@{node}/system"})

    assert driver.uri_for("h100-002") == "qemu+ssh://root@h100-002/system"


def test_what_libvirt_refuses_comes_back_with_its_message(hypervisor):
    driver = LibvirtDriver({**LIBVIRT_TEST_SETTINGS, "domain_type": "warp-drive"})

    with pytest.raises(DriverError, match=r"libvirt on h100-001: .*warp-drive") as raised:
        driver.create(vm_spec("vm-90"))

    assert type(raised.value) is DriverError
    assert "vm-90" not in domain_names()


def test_a_node_without_the_storage_pool_is_told_so(hypervisor):
    driver = LibvirtDriver({**LIBVIRT_TEST_SETTINGS, "storage_pool": "gpucap"})

    with pytest.raises(DriverError, match="node h100-001 has no libvirt storage pool 'gpucap'"):
        driver.create(vm_spec("vm-91"))
    assert "vm-91" not in domain_names()


def test_an_image_name_cannot_reach_outside_the_image_directory(hypervisor):
    with pytest.raises(
        DriverError, match=re.escape("image '../../etc/shadow' is not a plain image name")
    ):
        hypervisor.create(vm_spec("vm-92", image="../../etc/shadow"))
    assert "vm-92" not in domain_names()


def test_settings_problems_are_named_all_at_once():
    with pytest.raises(DriverError) as raised:
        LibvirtDriver({"uri": "qemu+ssh://{host}/system", "vcpus_per_gpu": "8", "firmware": "uefi"})

    assert str(raised.value) == (
        "libvirt driver settings: uri: unknown placeholder {host} (it may use {node}); "
        "vcpus_per_gpu: must be a whole number, got '8'; "
        "firmware: must be one of efi, bios, got 'uefi'"
    )


def test_the_uri_is_required():
    with pytest.raises(
        DriverError, match=re.escape("uri is required, e.g. 'qemu+ssh://root@{node}/system'")
    ):
        LibvirtDriver({})


def test_a_connection_lost_mid_call_is_a_transient_error(hypervisor, monkeypatch):
    def broken_pipe(connection, name):
        error = libvirt.libvirtError("virDomainLookupByName() failed")
        error.err = (
            libvirt.VIR_ERR_SYSTEM_ERROR,
            libvirt.VIR_FROM_RPC,
            "Cannot write data: Broken pipe",
            libvirt.VIR_ERR_ERROR,
            None,
            None,
            None,
            -1,
            -1,
        )
        raise error

    monkeypatch.setattr(libvirt.virConnect, "lookupByName", broken_pipe)

    with pytest.raises(DriverUnavailable, match=r"libvirt on h100-001 .*: Cannot write data"):
        hypervisor.status("vm-1", "h100-001")


# --- a real guest's seed, network and boot (issue 14) ------------------------------------------

NETWORK = GuestNetwork(
    mac="52:54:00:0A:D5:00", address="10.213.0.7/24", gateway="10.213.0.1", bridge="gpubr0"
)


def iso_file(data: bytes, name: str) -> bytes:
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(data))
    try:
        out = io.BytesIO()
        iso.get_file_from_iso_fp(out, rr_path=f"/{name}")
        return out.getvalue()
    finally:
        iso.close()


def test_a_guest_with_a_gpucap_address_plugs_into_its_nodes_bridge_with_its_mac(hypervisor):
    hypervisor.create(vm_spec("vm-90", network=NETWORK))
    interface = ET.fromstring(defined_xml("vm-90")).find("devices/interface")

    assert interface.get("type") == "bridge"
    assert interface.find("source").get("bridge") == "gpubr0"
    assert interface.find("mac").get("address") == "52:54:00:0a:d5:00"
    assert interface.find("model").get("type") == "virtio"


def test_a_guest_without_one_stays_on_the_clusters_network(hypervisor):
    hypervisor.create(vm_spec("vm-91"))
    interface = ET.fromstring(defined_xml("vm-91")).find("devices/interface")

    assert (interface.get("type"), interface.find("source").get("network")) == (
        "network",
        "default",
    )


def test_the_seed_is_uploaded_and_attached_read_only_with_the_key_and_address(hypervisor, uploads):
    hypervisor.create(vm_spec("vm-92", network=NETWORK, user_data="#!/bin/sh\necho hi\n"))
    disks = ET.fromstring(defined_xml("vm-92")).findall("devices/disk")
    seed = uploads["vm-92.seed.iso"]

    assert [d.find("target").get("dev") for d in disks] == ["vda", "vdb"]
    assert disks[1].find("source").get("file").endswith("vm-92.seed.iso")
    assert disks[1].find("readonly") is not None
    assert SSH_KEY.encode() in iso_file(seed, "user-data")
    assert b"echo hi" in iso_file(seed, "user-data") or b"ZWNobyBoaQ" in iso_file(seed, "user-data")
    assert json.loads(iso_file(seed, "network-config"))["ethernets"]["eth0"]["addresses"] == [
        "10.213.0.7/24"
    ]
    assert json.loads(iso_file(seed, "meta-data"))["instance-id"] == "vm-92"


def test_the_seed_is_written_afresh_when_the_vm_boots_again_with_a_new_address(hypervisor, uploads):
    hypervisor.create(vm_spec("vm-93", network=NETWORK))
    hypervisor.stop("vm-93", "h100-001")
    moved = GuestNetwork(mac="52:54:00:0a:d5:09", address="10.213.0.9/24", bridge="gpubr0")

    hypervisor.create(vm_spec("vm-93", network=moved))
    config = json.loads(iso_file(uploads["vm-93.seed.iso"], "network-config"))

    assert config["ethernets"]["eth0"]["addresses"] == ["10.213.0.9/24"]
    assert volume_names().count("vm-93.seed.iso") == 1


def test_status_reports_the_gpucap_address_and_a_replicas_endpoint(hypervisor):
    spec = vm_spec("vm-94", network=NETWORK, role="inference_replica", service_port=8000)

    status = hypervisor.create(spec)

    assert status.ip_address == "10.213.0.7"
    assert status.endpoint_url == "http://10.213.0.7:8000"
    assert hypervisor.status("vm-94", "h100-001").endpoint_url == "http://10.213.0.7:8000"


def test_destroy_removes_the_seed_with_the_disk(hypervisor):
    hypervisor.create(vm_spec("vm-95", network=NETWORK))

    hypervisor.destroy("vm-95", "h100-001")

    assert "vm-95.seed.iso" not in volume_names()
    assert "vm-95.qcow2" not in volume_names()


def test_user_data_that_cannot_go_into_a_seed_is_refused_by_name(hypervisor):
    with pytest.raises(DriverError, match=r"vm-96: user_data: must be text without NUL"):
        hypervisor.create(vm_spec("vm-96", user_data="\x00"))


def test_a_subnet_without_a_bridge_is_refused(hypervisor):
    bridgeless = GuestNetwork(mac="52:54:00:0a:d5:01", address="10.213.0.8/24")

    with pytest.raises(DriverError, match="node h100-001 has a guest subnet but no guest bridge"):
        hypervisor.create(vm_spec("vm-97", network=bridgeless))


def test_a_rig_without_gpus_to_pass_leaves_the_host_devices_out():
    shape = DomainShape(vcpus_per_gpu=1, memory_gib_per_gpu=1, gpu_passthrough=False)

    xml = domain_xml(vm_spec("vm-1"), shape=shape, disk_path="/d", image_path="/i")

    assert hostdev_addresses(xml) == []
    assert ET.fromstring(xml).findtext("vcpu") == "2"  # still sized by the GPUs it holds


def test_an_image_shipped_as_kernel_and_initrd_boots_directly_under_emulation():
    shape = DomainShape(
        vcpus_per_gpu=1,
        memory_gib_per_gpu=1,
        domain_type="qemu",
        kernel="/images/{image}.vmlinuz",
        initrd="/images/{image}.initrd",
        cmdline="console=ttyS0",
        serial_log="/var/log/gpucap/{instance}.log",
    )

    domain = ET.fromstring(
        domain_xml(vm_spec("vm-5", image="tiny"), shape=shape, disk_path="/d", image_path="/i")
    )

    assert domain.get("type") == "qemu"
    assert domain.find("cpu") is None  # no host CPU to pass through under TCG
    assert domain.findtext("os/kernel") == "/images/tiny.vmlinuz"
    assert domain.findtext("os/initrd") == "/images/tiny.initrd"
    assert domain.findtext("os/cmdline") == "console=ttyS0"
    assert domain.find("devices/serial").get("type") == "file"
    assert domain.find("devices/serial/source").get("path") == "/var/log/gpucap/vm-5.log"


def test_boot_and_console_settings_are_checked_by_name():
    with pytest.raises(DriverError) as caught:
        LibvirtDriver(
            {
                **LIBVIRT_TEST_SETTINGS,
                "kernel_path": "/images/{name}.vmlinuz",
                "serial_log_path": "/var/log/{node}.log",
                "gpu_passthrough": "no",
            }
        )

    message = str(caught.value)
    assert "kernel_path: unknown placeholder {name} (it may use {image})" in message
    assert "serial_log_path: unknown placeholder {node} (it may use {instance})" in message
    assert "gpu_passthrough: must be true or false, got 'no'" in message


def backing_file(instance_id: str) -> str:
    return (
        ET.fromstring(defined_xml(instance_id)).find("devices/disk/backingStore/source").get("file")
    )


def test_the_catalogues_base_image_path_backs_the_overlay(hypervisor):
    hypervisor.create(vm_spec("vm-100", base_image="/srv/images/noble-cuda.qcow2"))

    assert backing_file("vm-100") == "/srv/images/noble-cuda.qcow2"


def test_a_base_image_named_as_a_volume_is_found_in_the_nodes_pool(hypervisor):
    pool = libvirt_connection().storagePoolLookupByName("default-pool")
    pool.createXML(
        "<volume><name>noble-cuda.qcow2</name><capacity unit='GiB'>1</capacity>"
        "<target><format type='qcow2'/></target></volume>",
        0,
    )

    hypervisor.create(vm_spec("vm-101", base_image="noble-cuda.qcow2"))

    assert backing_file("vm-101") == "/default-pool/noble-cuda.qcow2"


def test_a_base_image_volume_the_node_lacks_is_named(hypervisor):
    with pytest.raises(
        DriverError,
        match=re.escape(
            "node h100-001 has no volume 'noble-cuda.qcow2' (image ubuntu-24.04-cuda-12.6) in "
            "its storage pool 'default-pool'"
        ),
    ):
        hypervisor.create(vm_spec("vm-102", base_image="noble-cuda.qcow2"))
    assert "vm-102" not in domain_names()
