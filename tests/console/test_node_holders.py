"""The node page says who holds each GPU: the VM (linking to its page), its tenant and its
pool, in a fixed number of queries whatever the number of VMs on the node."""

import re

import pytest
from django.urls import reverse

from gpucap.fleet import services as fleet
from gpucap.notices import drains
from gpucap.rentals import services as rentals
from tests.rentals.vm_helpers import running_vm

HTMX = {"HX-Request": "true"}


@pytest.fixture
def spot(fleet_east, tenant, other_tenant):
    pool = fleet_east["pools"]["h100-spot"]
    fleet.pool_set_tenants(pool=pool, tenants=[tenant, other_tenant])
    return pool


def node_page(client, hostname: str = "h100-001", **extra) -> str:
    url = reverse("fleet:node-detail", kwargs={"cluster": "east", "hostname": hostname})
    return client.get(url, **extra).content.decode()


def gpu_row(page: str, index: int) -> str:
    """The row of GPU ``index`` in the node's GPU table."""
    rows = re.findall(r'<tr>\s*<td class="num">(\d+)</td>(.*?)</tr>', page, flags=re.S)
    return next(row for number, row in rows if int(number) == index)


def test_each_gpu_names_the_vm_tenant_and_pool_holding_it(
    operator_client, fleet_east, spot, tenant, other_tenant
):
    node = fleet_east["nodes"]["h100-001"]
    trainer = running_vm(tenant, spot, node, [0, 1], name="trainer", ip="10.0.0.11")
    notebook = running_vm(other_tenant, spot, node, [4], name="notebook", ip="10.0.0.12")

    page = node_page(operator_client)

    for index in (0, 1):
        row = gpu_row(page, index)
        assert f'href="{reverse("rentals:vm-detail", kwargs={"pk": trainer.pk})}"' in row
        assert ">trainer</a>" in row and tenant.name in row and "h100-spot" in row
    row = gpu_row(page, 4)
    assert f'href="{reverse("rentals:vm-detail", kwargs={"pk": notebook.pk})}"' in row
    assert other_tenant.name in row
    assert f'href="{reverse("tenant-detail", kwargs={"slug": other_tenant.slug})}"' in row
    free = gpu_row(page, 2)
    assert "vms/" not in free and free.count('<td class="muted">—</td>') == 3


def test_a_stopped_vm_no_longer_holds_its_gpus(operator_client, fleet_east, spot, tenant):
    node = fleet_east["nodes"]["h100-001"]
    vm = running_vm(tenant, spot, node, [3], name="done", ip="10.0.0.13")
    rentals.vm_mark_stopped(vm=rentals.vm_stop(vm=vm))

    page = node_page(operator_client)

    assert ">done</a>" not in gpu_row(page, 3)


def test_the_draining_nodes_live_part_names_the_holders_too(
    operator, operator_client, fleet_east, spot, tenant
):
    node = fleet_east["nodes"]["h100-001"]
    running_vm(tenant, spot, node, [6], name="leaving", ip="10.0.0.14")
    drains.node_drain(node=node, actor=operator)

    fragment = node_page(operator_client, headers=HTMX)

    assert fragment.lstrip().startswith('<div id="node-live"')
    assert ">leaving</a>" in gpu_row(fragment, 6) and tenant.name in gpu_row(fragment, 6)


def test_the_node_page_runs_a_fixed_number_of_queries_whatever_holds_its_gpus(
    operator_client, fleet_east, spot, tenant, other_tenant, django_assert_num_queries
):
    node = fleet_east["nodes"]["h100-001"]
    running_vm(tenant, spot, node, [0], name="first", ip="10.0.0.20")
    # ... the tenants the dedication form offers; the BMC panel's credentials and inventory,
    # and its latest discovery; the node's provisioning runs.
    with django_assert_num_queries(11):
        node_page(operator_client)
    for index in range(1, 8):
        owner = tenant if index % 2 else other_tenant
        running_vm(owner, spot, node, [index], name=f"vm{index}", ip=f"10.0.0.{20 + index}")
    with django_assert_num_queries(11):
        page = node_page(operator_client)
    assert all(">vm" in gpu_row(page, index) for index in range(1, 8))


def test_tenant_members_never_see_who_holds_a_node(member_client, fleet_east, spot, tenant):
    running_vm(
        tenant, spot, fleet_east["nodes"]["h100-001"], [0], name="secret-trainer", ip="10.0.0.30"
    )
    url = reverse("fleet:node-detail", kwargs={"cluster": "east", "hostname": "h100-001"})

    response = member_client.get(url)

    assert response.status_code == 403
    assert "secret-trainer" not in response.content.decode()
