"""A guest's address and the SSH command to reach it, on the VM page, the tenant's VM list and
the portal, for the VM's own tenant; and user-data on the request form."""

import pytest
from django.urls import reverse

from gpucap.fleet import services as fleet
from gpucap.rentals import services
from gpucap.rentals.models import VirtualMachine
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.vm_helpers import request_vm, world
from tests.vms.test_pages import HTMX, detail_url, field_error, request_form, tenant_vms_url

pools = rentals_fixtures.pools
nodes = rentals_fixtures.nodes

SSH = "ssh ubuntu@10.200.0.2"


@pytest.fixture
def running(tenant, pools, nodes) -> VirtualMachine:
    node = fleet.node_update(
        node=nodes["a100-001"], guest_bridge="gpubr0", guest_subnet="10.200.0.0/24"
    )
    vm = request_vm(tenant, pools["a100-standalone"], name="wired")
    vm = services.vm_place(vm=vm, node=node, gpu_indices=[0])
    return services.vm_mark_running(vm=vm, ip_address="192.168.122.9")


def test_the_vm_page_shows_the_owner_the_ssh_command(member_client, running):
    page = member_client.get(detail_url(running)).content.decode()

    assert f'<code class="ssh-command">{SSH}</code>' in page
    assert "192.168.122.9" not in page


def test_the_ssh_command_is_shown_only_while_the_guest_runs(member_client, running):
    services.vm_stop(vm=running)

    page = member_client.get(detail_url(running), headers=HTMX).content.decode()

    assert SSH not in page


def test_the_tenants_vm_list_and_portal_show_the_address_and_ssh_command(member_client, running):
    listing = member_client.get(tenant_vms_url()).content.decode()
    portal = member_client.get(reverse("tenant-detail", kwargs={"slug": "acme"})).content

    assert SSH in listing
    assert SSH in portal.decode()


def test_another_tenants_member_sees_neither_the_page_nor_the_address(other_member_client, running):
    assert other_member_client.get(detail_url(running)).status_code == 404
    portal = other_member_client.get(reverse("tenant-detail", kwargs={"slug": "globex"}))
    assert "10.200.0.2" not in portal.content.decode()


def test_a_member_requests_a_vm_with_user_data(member_client, tenant, pools):
    response = member_client.post(
        tenant_vms_url(),
        request_form(pools["a100-standalone"], user_data="#!/bin/sh\necho hi\n"),
        headers=HTMX,
    )

    assert response.status_code == 200
    assert VirtualMachine.objects.get(tenant=tenant, name="train-01").user_data == (
        "#!/bin/sh\necho hi\n"
    )


def test_unusable_user_data_is_refused_next_to_the_field(member_client, pools):
    before = world()

    response = member_client.post(
        tenant_vms_url(),
        request_form(pools["a100-standalone"], user_data="#cloud-config\n- a list\n"),
        headers=HTMX,
    )

    assert response.status_code == 400
    assert "not a YAML mapping" in field_error(response.content.decode(), "user_data")
    assert world() == before
