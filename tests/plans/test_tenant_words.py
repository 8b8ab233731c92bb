"""A tenant reads why its VM is interrupted in words that name only its own resources: the
arbiter's reasons name the VM and pool a reclaim is for and the pools' totals, which are another
tenant's business. Operators keep the full reasons."""

import html
import re

from django.urls import reverse

from gpucap.fleet import services as fleet
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import request_vm, running_vm


def _approved_reclaim(h100, on_demand_request, operator):
    """globex's on-demand request reclaims two of acme's spot VMs; the plan is approved."""
    vm = on_demand_request()
    plan = services.capacity_set_tick(capacity_set_id=h100.pk).plan
    services.plan_approve(plan=plan, actor=operator)
    victims = [n.vm for n in InterruptionNotice.objects.filter(plan=plan).select_related("vm")]
    assert len(victims) == 2
    return vm, victims


def _text(response) -> str:
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def test_the_victims_tenant_never_reads_the_other_tenants_vm_or_pool(
    h100, on_demand_request, operator, member_client, member_api
):
    train, victims = _approved_reclaim(h100, on_demand_request, operator)
    pages = [
        _text(member_client.get(f"/vms/{victims[0].pk}/")),
        _text(member_client.get("/notices/")),
        _text(member_client.get(reverse("tenant-detail", kwargs={"slug": "acme"}))),
        _text(member_client.get(reverse("rentals:tenant-vms", args=["acme"]))),
        _text(member_api.get("/api/notices/")),
        _text(member_api.get("/api/vms/")),
        _text(member_api.get(f"/api/vms/{victims[0].pk}/")),
    ]
    for page in pages:
        assert train.instance_id not in page
        assert "h100-ondemand" not in page
        assert "rank 2" not in page
        assert not re.search(r"\(\d+ → \d+\)", page)  # the pools' totals
    assert "Reclaimed by the capacity arbiter for a higher-priority pool" in pages[0]
    messages = {n["message"] for n in member_api.get("/api/notices/").json()["results"]}
    assert messages == {"reclaimed by the capacity arbiter for a higher-priority pool"}


def test_operators_keep_the_arbiters_full_reason(
    h100, on_demand_request, operator, operator_client, operator_api
):
    train, victims = _approved_reclaim(h100, on_demand_request, operator)

    assert f"reclaimed for {train.instance_id}" in _text(operator_client.get("/notices/"))
    assert f"reclaimed for {train.instance_id}" in _text(
        operator_client.get(f"/vms/{victims[0].pk}/")
    )
    messages = [n["message"] for n in operator_api.get("/api/notices/").json()["results"]]
    assert all(f"reclaimed for {train.instance_id}" in message for message in messages)


def test_the_placed_tenant_never_reads_the_reclaimed_tenants_vms_or_pool(
    h100, on_demand_request, operator, other_member_client, other_member_api
):
    train, victims = _approved_reclaim(h100, on_demand_request, operator)
    for victim in victims:  # the notices run out and the driver reports the victims off
        stopping = rentals.vm_stop_for_notice(vm=victim, message="arbiter notice deadline reached")
        rentals.vm_mark_stopped(vm=stopping)
    services.placements_complete(capacity_set=h100)
    assert VirtualMachine.objects.get(pk=train.pk).state == VirtualMachine.State.PROVISIONING

    pages = [
        _text(other_member_client.get(f"/vms/{train.pk}/")),
        _text(other_member_client.get(reverse("rentals:tenant-vms", args=["globex"]))),
        _text(other_member_api.get("/api/vms/")),
    ]
    for page in pages:
        for victim in victims:
            assert victim.instance_id not in page
        assert "h100-spot" not in page
    assert "placed by the capacity arbiter" in pages[0]


def test_a_standalone_preemption_does_not_name_the_vm_it_was_for(
    fleet_east, tenant, other_tenant, member_client
):
    pool = fleet_east["pools"]["a100-standalone"]
    fleet.pool_set_tenants(pool=pool, tenants=[tenant, other_tenant])
    victim = running_vm(tenant, pool, fleet_east["nodes"]["a100-001"], [0], name="a", ip="10.0.0.2")
    other = request_vm(other_tenant, pool, name="b", gpu_count=8)
    rentals.vm_preempt(vm=victim, for_vm=other)

    page = _text(member_client.get(f"/vms/{victim.pk}/"))

    assert other.instance_id not in page
    assert "preempted without notice for a higher-priority pool" in page
