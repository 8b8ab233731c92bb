"""A placed VM's address and MAC from its node's guest subnet: the lowest free one, unique among
live VMs by the database, released with the GPUs and reused, refused clearly when the subnet is
full, and handed to the driver in the VmSpec."""

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.urls import reverse

from gpucap.drivers.base import GuestNetwork
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.rentals import services
from gpucap.rentals.models import Allocation, GuestAddress, VirtualMachine
from gpucap.rentals.tasks import _spec
from tests.conftest import PASSWORD
from tests.rentals.vm_helpers import request_vm

State = VirtualMachine.State


@pytest.fixture
def subnet_node(nodes):
    """h100-001 with guest bridge gpubr0 and subnet 10.200.0.0/24 (gateway 10.200.0.1)."""
    return fleet.node_update(
        node=nodes["h100-001"], guest_bridge="gpubr0", guest_subnet="10.200.0.0/24"
    )


def place(pool, node, gpus, *, name):
    vm = request_vm(pool.tenants.first(), pool, name=name, gpu_count=len(gpus))
    return services.vm_place(vm=vm, node=node, gpu_indices=gpus)


def live_address(vm) -> GuestAddress:
    return GuestAddress.objects.get(vm=vm, released_at=None)


def test_a_placed_vm_gets_the_lowest_free_address_of_its_nodes_subnet_and_a_local_mac(
    pools, subnet_node
):
    first = place(pools["h100-spot"], subnet_node, [0], name="first")
    second = place(pools["h100-spot"], subnet_node, [1], name="second")

    # The metadata endpoint knows the guest by this address while it boots.
    assert (first.state, first.ip_address) == (State.PROVISIONING, "10.200.0.2")
    assert second.ip_address == "10.200.0.3"
    assert live_address(first).mac == "52:54:00:c8:00:02"
    assert live_address(second).mac == "52:54:00:c8:00:03"


def test_the_drivers_address_does_not_overrule_the_one_gpucap_gave(pools, subnet_node):
    vm = place(pools["h100-spot"], subnet_node, [0], name="booted")

    running = services.vm_mark_running(vm=vm, ip_address="192.168.122.40")

    assert (running.state, running.ip_address) == (State.RUNNING, "10.200.0.2")


def test_a_node_without_a_subnet_keeps_taking_the_address_its_driver_reports(pools, nodes):
    vm = place(pools["h100-spot"], nodes["h100-002"], [0], name="simulated")

    assert vm.ip_address is None
    assert not GuestAddress.objects.filter(vm=vm).exists()
    assert _spec(vm).network is None
    assert services.vm_mark_running(vm=vm, ip_address="10.9.0.7").ip_address == "10.9.0.7"


def test_the_address_is_released_with_the_gpus_and_the_lowest_is_reused(pools, subnet_node):
    leaving = place(pools["h100-spot"], subnet_node, [0], name="leaving")
    staying = place(pools["h100-spot"], subnet_node, [1], name="staying")
    services.vm_mark_running(vm=leaving, ip_address="10.200.0.2")
    services.vm_stop(vm=leaving)

    # Stopping: the guest still holds its GPUs, and so its address.
    assert live_address(leaving).address == "10.200.0.2"
    services.vm_mark_stopped(vm=leaving)
    newcomer = place(pools["h100-spot"], subnet_node, [2], name="newcomer")

    assert not GuestAddress.objects.filter(vm=leaving, released_at=None).exists()
    assert GuestAddress.objects.get(vm=leaving).released_at is not None
    assert newcomer.ip_address == "10.200.0.2"
    assert staying.ip_address == "10.200.0.3"


def test_a_failed_vm_releases_its_address(pools, subnet_node):
    vm = place(pools["h100-spot"], subnet_node, [0], name="doomed")

    services.vm_mark_failed(vm=vm, reason="the hypervisor caught fire")

    assert not GuestAddress.objects.filter(released_at=None).exists()
    assert place(pools["h100-spot"], subnet_node, [1], name="next").ip_address == "10.200.0.2"


def test_a_full_subnet_is_a_conflict_naming_node_and_subnet_and_the_vm_stays_pending(pools, nodes):
    # A /30 holds the gateway (10.9.8.1) and one guest (10.9.8.2).
    node = fleet.node_update(node=nodes["h100-001"], guest_bridge="br0", guest_subnet="10.9.8.0/30")
    place(pools["h100-spot"], node, [0], name="only")
    waiting = request_vm(pools["h100-spot"].tenants.first(), pools["h100-spot"], name="waiting")

    with pytest.raises(Conflict) as refused:
        services.vm_place(vm=waiting, node=node, gpu_indices=[1])

    assert refused.value.code == "guest_subnet_full"
    assert "10.9.8.0/30" in refused.value.message and "h100-001" in refused.value.message
    waiting.refresh_from_db()
    assert (waiting.state, waiting.node_id, waiting.ip_address) == (State.PENDING, None, None)
    assert not Allocation.objects.filter(vm=waiting).exists()  # its GPUs were not kept


def test_the_spec_carries_the_guest_network(pools, subnet_node):
    vm = place(pools["h100-spot"], subnet_node, [0], name="wired")

    assert _spec(vm).network == GuestNetwork(
        mac="52:54:00:c8:00:02",
        address="10.200.0.2/24",
        gateway="10.200.0.1",
        nameservers=(),
        bridge="gpubr0",
    )


def test_the_database_keeps_an_address_and_a_mac_to_one_live_holder(pools, subnet_node):
    holder = place(pools["h100-spot"], subnet_node, [0], name="holder")
    other = place(pools["h100-spot"], subnet_node, [1], name="other")

    with pytest.raises(IntegrityError), transaction.atomic():
        GuestAddress.objects.create(
            vm=other, node=subnet_node, address="10.200.0.2", mac="52:54:00:aa:bb:cc"
        )
    with pytest.raises(IntegrityError), transaction.atomic():
        GuestAddress.objects.create(
            vm=other, node=subnet_node, address="10.200.0.99", mac=live_address(holder).mac
        )
    with pytest.raises(IntegrityError), transaction.atomic():
        GuestAddress.objects.filter(vm=other).update(mac="00:1b:21:00:00:01")  # a vendor's


def test_the_guest_network_of_a_node_with_guests_cannot_change(pools, subnet_node):
    place(pools["h100-spot"], subnet_node, [0], name="holder")

    with pytest.raises(Conflict) as refused:
        fleet.node_update(node=subnet_node, guest_subnet="10.201.0.0/24")

    assert "h100-001" in refused.value.message
    subnet_node.refresh_from_db()
    assert subnet_node.guest_subnet == "10.200.0.0/24"


def test_the_admin_finds_who_held_an_address_read_only(client, pools, subnet_node):
    held = place(pools["h100-spot"], subnet_node, [0], name="held")
    place(pools["h100-spot"], subnet_node, [1], name="other")
    client.force_login(User.objects.create_superuser("root", password=PASSWORD))

    found = client.get(reverse("admin:rentals_guestaddress_changelist") + "?q=10.200.0.2")
    vm_page = client.get(reverse("admin:rentals_virtualmachine_change", args=[held.pk]))

    assert found.status_code == 200
    assert [row.vm_id for row in found.context["cl"].result_list] == [held.pk]
    assert "52:54:00:c8:00:02" in vm_page.content.decode()
    assert client.get(reverse("admin:rentals_guestaddress_add")).status_code == 403
