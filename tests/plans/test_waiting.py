"""A tenant's pending VM says why it waits and roughly when it starts: on the VM pages, the portal
and ``/api/vms/``."""

import html

from django.urls import reverse

from gpucap.fleet import services as fleet
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services
from gpucap.plans.waiting import APPROVAL, FREEING, NO_CAPACITY, STANDALONE, vm_waiting
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import request_vm


def _page(client, url: str) -> str:
    return html.unescape(client.get(url).content.decode())


def test_a_vm_a_proposed_dry_run_plan_places_awaits_operator_approval(
    h100, on_demand_request, other_member_client, other_member_api
):
    vm = on_demand_request()
    services.capacity_set_tick(capacity_set_id=h100.pk)

    assert vm_waiting(vm).reason == APPROVAL
    assert "awaiting operator approval" in _page(other_member_client, f"/vms/{vm.pk}/")
    assert "awaiting operator approval" in _page(other_member_client, "/tenants/globex/vms/")
    waiting = other_member_api.get(f"/api/vms/{vm.pk}/").json()["waiting"]
    assert waiting["reason"] == APPROVAL
    assert waiting["starts_by"] is None


def test_a_vm_an_approved_plan_places_starts_by_the_latest_notice_deadline(
    h100, on_demand_request, operator, other_member_client, other_member_api
):
    vm = on_demand_request()
    plan = services.capacity_set_tick(capacity_set_id=h100.pk).plan
    services.plan_approve(plan=plan, actor=operator)
    notices = list(InterruptionNotice.objects.filter(plan=plan))
    assert len(notices) == 2
    # The victims' deadlines differ: the VM starts by the later one.
    later = notices[0].deadline.replace(microsecond=0) + (
        notices[0].deadline - notices[0].issued_at
    )
    InterruptionNotice.objects.filter(pk=notices[1].pk).update(deadline=later)

    waiting = vm_waiting(VirtualMachine.objects.get(pk=vm.pk))

    assert waiting.reason == FREEING
    assert waiting.starts_by == later
    expected = f"GPUs being freed, starts by {later:%H:%M} UTC"
    assert waiting.message == expected
    assert expected in _page(other_member_client, f"/vms/{vm.pk}/")
    portal = reverse("tenant-detail", kwargs={"slug": "globex"})
    assert expected in _page(other_member_client, portal)
    body = other_member_api.get("/api/vms/").json()
    row = next(item for item in body["results"] if item["id"] == vm.pk)
    assert row["waiting"]["reason"] == FREEING
    assert row["waiting"]["starts_by"].startswith(later.strftime("%Y-%m-%dT%H:%M:%S"))


def test_a_vm_no_plan_places_is_told_its_place_in_its_pools_line(
    h100, on_demand_request, other_member_client, other_member_api
):
    *_ahead, third = (on_demand_request(f"train-{n}") for n in (1, 2, 3))
    services.capacity_set_tick(capacity_set_id=h100.pk)

    waiting = vm_waiting(third)

    assert waiting.reason == NO_CAPACITY
    assert waiting.message == "no capacity in pool h100-ondemand; you are number 3 in line"
    assert waiting.message in _page(other_member_client, "/tenants/globex/vms/")
    assert other_member_api.get(f"/api/vms/{third.pk}/").json()["waiting"] == {
        "reason": NO_CAPACITY,
        "message": waiting.message,
        "starts_by": None,
    }


def test_a_vm_of_a_standalone_pool_waits_for_the_clusters_standalone_nodes(
    fleet_east, tenant, member_client
):
    pool = fleet_east["pools"]["a100-standalone"]
    fleet.pool_set_tenants(pool=pool, tenants=[tenant])
    request_vm(tenant, pool, name="first", gpu_count=8)
    second = request_vm(tenant, pool, name="second", gpu_count=8)

    expected = "waiting for free GPUs on the cluster's standalone nodes; number 2 in line"
    assert vm_waiting(second).reason == STANDALONE
    assert vm_waiting(second).message == expected
    assert expected in _page(member_client, "/tenants/acme/vms/")


def test_a_vm_that_does_not_wait_says_nothing(full_set, member_api):
    assert vm_waiting(full_set[0]) is None
    assert member_api.get(f"/api/vms/{full_set[0].pk}/").json()["waiting"] is None


def test_another_tenants_vm_reveals_nothing_of_why_it_waits(
    h100, on_demand_request, member_api, member_client
):
    vm = on_demand_request()
    services.capacity_set_tick(capacity_set_id=h100.pk)

    assert member_api.get(f"/api/vms/{vm.pk}/").status_code == 404
    assert member_client.get(f"/vms/{vm.pk}/").status_code == 404
    assert vm.instance_id not in _page(member_client, "/tenants/acme/vms/")


def test_the_tenant_vm_list_and_api_run_a_fixed_number_of_queries(
    h100,
    on_demand_request,
    operator,
    other_member_client,
    other_member_api,
    django_assert_num_queries,
):
    plan_vm = on_demand_request("train-0")
    services.plan_approve(
        plan=services.capacity_set_tick(capacity_set_id=h100.pk).plan, actor=operator
    )
    assert vm_waiting(VirtualMachine.objects.get(pk=plan_vm.pk)).reason == FREEING
    on_demand_request("train-1")
    url = reverse("rentals:tenant-vms", args=["globex"])
    other_member_api.get("/api/vms/")  # the first request caches the member's tenants
    # session, user; memberships, tenant; VMs, their GPUs, terminated count; why they wait
    # (line, placements, victims, notices); pools; images.
    with django_assert_num_queries(13):
        other_member_client.get(url)
    with django_assert_num_queries(7):
        other_member_api.get("/api/vms/")
    for n in range(2, 7):
        on_demand_request(f"train-{n}")
    with django_assert_num_queries(13):
        response = other_member_client.get(url)
    assert len(response.context["listing"].vms) == 7
    with django_assert_num_queries(7):
        assert other_member_api.get("/api/vms/").json()["count"] == 7
