"""/api/vms/ and a guest's access: tenant user-data accepted (or refused naming ``user_data``,
nothing created) and the address with the SSH command to use, shown to the VM's tenant only."""

import pytest

from gpucap.fleet import services as fleet
from gpucap.rentals import services
from gpucap.rentals.models import VirtualMachine
from tests.rentals.test_api import assert_invalid, body, vm_url
from tests.rentals.vm_helpers import request_vm, world

State = VirtualMachine.State


@pytest.fixture
def placed(tenant, pools, nodes) -> VirtualMachine:
    """acme's VM on a100-001, whose guests get addresses from 10.200.0.0/24."""
    node = fleet.node_update(
        node=nodes["a100-001"], guest_bridge="gpubr0", guest_subnet="10.200.0.0/24"
    )
    vm = request_vm(tenant, pools["a100-standalone"], name="wired")
    return services.vm_place(vm=vm, node=node, gpu_indices=[0])


def test_a_member_requests_a_vm_with_user_data(member_api, pools):
    user_data = "#cloud-config\npackages: [htop]\n"

    response = member_api.post(
        "/api/vms/", body(pools["a100-standalone"], user_data=user_data), format="json"
    )

    assert response.status_code == 201, response.content
    assert VirtualMachine.objects.get(pk=response.data["id"]).user_data == user_data


@pytest.mark.parametrize(
    ("user_data", "reason"),
    [
        ("#!/bin/sh\n" + "x" * 16 * 1024, "at most 16,384 are allowed"),
        ("#cloud-config\n- just\n- a list\n", "not a YAML mapping"),
        ("#cloud-config\nkey: [unclosed\n", "not valid YAML"),
        ("text with a \x00 in it", "contains the control character U+0000"),  # refused at parsing
    ],
)
def test_unusable_user_data_is_a_400_naming_user_data_and_creates_nothing(
    member_api, pools, user_data, reason
):
    before = world()

    response = member_api.post(
        "/api/vms/", body(pools["a100-standalone"], user_data=user_data), format="json"
    )

    assert_invalid(response, "user_data", reason)
    assert world() == before


def test_the_owner_sees_the_address_at_once_and_the_ssh_command_once_it_runs(member_api, placed):
    booting = member_api.get(vm_url(placed)).data
    services.vm_mark_running(vm=placed, ip_address="192.168.122.9")
    running = member_api.get(vm_url(placed)).data

    assert (booting["state"], booting["ip_address"], booting["ssh_command"]) == (
        "provisioning",
        "10.200.0.2",
        None,
    )
    assert (running["ip_address"], running["ssh_command"]) == (
        "10.200.0.2",
        "ssh ubuntu@10.200.0.2",
    )
    listed = member_api.get("/api/vms/").data["results"]
    assert [vm["ssh_command"] for vm in listed] == ["ssh ubuntu@10.200.0.2"]


def test_another_tenants_member_cannot_read_the_address(other_member_api, placed):
    services.vm_mark_running(vm=placed, ip_address="10.200.0.2")

    assert other_member_api.get(vm_url(placed)).status_code == 404
    assert other_member_api.get("/api/vms/").data["results"] == []
