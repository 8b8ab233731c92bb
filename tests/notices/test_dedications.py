"""Dedicated nodes (issue 19, part 3): dedicating a node previews and then sends notices to the
other tenants' spot VMs and replicas on it, waits for their on-demand VMs, and from then on the
arbiter and standalone placement put only the tenant's VMs there; releasing gives it back."""

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet, Node
from gpucap.notices import dedications, tasks
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services as plans
from gpucap.plans import standalone
from gpucap.plans.models import Plan, PlanAction
from gpucap.plans.snapshot import capacity_set_snapshot
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.notices.test_drains import replica_on
from tests.rentals.vm_helpers import request_vm, running_vm, world

State = VirtualMachine.State
Kind = PlanAction.Kind


@pytest.fixture
def shared_node(fleet_east, tenant, other_tenant):
    """h100-001, shared, with globex's running spot VM, globex's on-demand VM and acme's own
    spot VM on it."""
    pools, node = fleet_east["pools"], fleet_east["nodes"]["h100-001"]
    for pool in ("h100-spot", "h100-ondemand"):
        fleet.pool_set_tenants(pool=pools[pool], tenants=[tenant, other_tenant])
    return {
        "node": node,
        "their_spot": running_vm(
            other_tenant, pools["h100-spot"], node, [0, 1], name="g-spot", ip="10.9.0.1"
        ),
        "their_on_demand": running_vm(
            other_tenant, pools["h100-ondemand"], node, [2, 3], name="g-od", ip="10.9.0.2"
        ),
        "own_spot": running_vm(
            tenant, pools["h100-spot"], node, [4, 5, 6, 7], name="a-spot", ip="10.9.0.3"
        ),
    }


def open_notices() -> list[str]:
    return sorted(
        InterruptionNotice.objects.filter(completed_at=None).values_list("vm__name", flat=True)
    )


def test_preview_names_other_tenants_spot_vms_for_notices_and_on_demand_as_holders(
    shared_node, tenant
):
    before = world()

    preview = dedications.node_dedicate_preview(node=shared_node["node"], tenant=tenant)

    assert [vm.name for vm in preview.notices] == ["g-spot"]
    assert [b.vm.name for b in preview.holders] == ["g-od"]
    assert preview.holders[0].waiting_for == "on_demand"
    assert not preview.applied and not preview.complete
    assert world() == before, "a preview changes nothing"
    assert Node.objects.get(pk=shared_node["node"].pk).dedicated_tenant_id is None


def test_dedicating_notifies_once_and_keeps_on_demand_running(shared_node, tenant, operator):
    h100 = CapacitySet.objects.get(name="h100-east")
    generation = h100.generation

    first = dedications.node_dedicate(node=shared_node["node"], tenant=tenant, actor=operator)
    second = dedications.node_dedicate(node=shared_node["node"], tenant=tenant, actor=operator)

    assert [vm.name for vm in first.notices] == ["g-spot"]
    assert second.notices == [], "a second apply sends no notice"
    assert open_notices() == ["g-spot"]
    notice = InterruptionNotice.objects.get(vm=shared_node["their_spot"])
    assert notice.reason == InterruptionNotice.Reason.DRAIN
    assert (notice.deadline - notice.issued_at).total_seconds() == h100.notice_seconds
    assert "dedicated" in notice.message
    vm = VirtualMachine.objects.get
    assert vm(pk=shared_node["their_on_demand"].pk).state == State.RUNNING
    assert vm(pk=shared_node["own_spot"].pk).state == State.RUNNING
    # Who holds it up after the apply: the notified VM (until its deadline), the on-demand one.
    assert {b.vm.name: b.waiting_for for b in second.holders} == {
        "g-spot": "notice",
        "g-od": "on_demand",
    }
    node = Node.objects.get(pk=shared_node["node"].pk)
    assert node.dedicated_tenant == tenant and node.state == Node.State.READY
    assert CapacitySet.objects.get(pk=h100.pk).generation > generation, "the set replans"
    assert AuditEvent.objects.filter(verb="node.dedicate").count() == 1


def test_a_node_dedicated_to_another_tenant_is_refused_naming_it(
    shared_node, tenant, other_tenant, operator
):
    dedications.node_dedicate(node=shared_node["node"], tenant=other_tenant, actor=operator)
    before = world()

    with pytest.raises(Conflict, match="dedicated to tenant Globex") as refused:
        dedications.node_dedicate_preview(node=shared_node["node"], tenant=tenant)
    assert refused.value.code == "node_dedicated"
    with pytest.raises(Conflict, match="release it first"):
        dedications.node_dedicate(node=shared_node["node"], tenant=tenant, actor=operator)
    assert world() == before


def test_releasing_returns_the_node_and_a_shared_node_cannot_be_released(
    fleet_east, tenant, operator
):
    node = fleet_east["nodes"]["h100-002"]
    with pytest.raises(Conflict, match="not dedicated") as refused:
        dedications.node_release(node=node, actor=operator)
    assert refused.value.code == "node_not_dedicated"

    dedications.node_dedicate(node=node, tenant=tenant, actor=operator)
    dedications.node_release(node=node, actor=operator)

    assert Node.objects.get(pk=node.pk).dedicated_tenant is None
    assert AuditEvent.objects.filter(verb="node.release").count() == 1


def test_the_sweep_warns_a_vm_that_was_booting_when_the_node_was_dedicated(
    fleet_east, tenant, other_tenant, operator
):
    pools, node = fleet_east["pools"], fleet_east["nodes"]["h100-001"]
    fleet.pool_set_tenants(pool=pools["h100-spot"], tenants=[other_tenant])
    booting = request_vm(other_tenant, pools["h100-spot"], name="g-boot", gpu_count=2)
    rentals.vm_place(vm=booting, node=node, gpu_indices=[0, 1])
    preview = dedications.node_dedicate(node=node, tenant=tenant, actor=operator)
    assert preview.notices == [] and preview.holders[0].waiting_for == "starting"

    rentals.vm_mark_running(vm=booting, ip_address="10.9.0.9")
    tasks.sweep()

    assert open_notices() == ["g-boot"]
    assert dedications.dedications_sweep() == 0, "a second sweep warns nobody again"


def test_a_planning_tick_places_only_the_tenants_demands_on_its_dedicated_node(
    fleet_east, tenant, other_tenant, operator
):
    pools, h100 = fleet_east["pools"], fleet_east["sets"]["h100-east"]
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[tenant, other_tenant])
    dedications.node_dedicate(node=fleet_east["nodes"]["h100-001"], tenant=tenant, actor=operator)
    globex_first = request_vm(other_tenant, pools["h100-ondemand"], name="g-1", gpu_count=8)
    globex_second = request_vm(other_tenant, pools["h100-ondemand"], name="g-2", gpu_count=8)
    acme = request_vm(tenant, pools["h100-spot"], name="a-1", gpu_count=8)

    plan = plans.capacity_set_tick(capacity_set_id=h100.pk).plan

    placed = {
        a.vm.name: a.node.hostname
        for a in plan.actions.filter(kind=Kind.PLACEMENT).select_related("vm", "node")
    }
    # Globex ranks above acme's spot pool, yet the dedicated node is acme's alone.
    assert placed == {globex_first.name: "h100-002", acme.name: "h100-001"}
    waiting = plan.actions.get(kind=Kind.UNSATISFIED)
    assert waiting.vm == globex_second
    assert "dedicated to other tenants (h100-001)" in waiting.reason
    assert plan.status == Plan.Status.PROPOSED


def test_releasing_makes_the_node_free_capacity_for_every_tenant(
    fleet_east, tenant, other_tenant, operator
):
    pools, h100 = fleet_east["pools"], fleet_east["sets"]["h100-east"]
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[other_tenant])
    node = fleet_east["nodes"]["h100-001"]
    dedications.node_dedicate(node=node, tenant=tenant, actor=operator)
    for n in (1, 2):
        request_vm(other_tenant, pools["h100-ondemand"], name=f"g-{n}", gpu_count=8)
    assert plans.capacity_set_tick(capacity_set_id=h100.pk).plan.placements == 1

    dedications.node_release(node=node, actor=operator)

    assert plans.capacity_set_tick(capacity_set_id=h100.pk).plan.placements == 2


def test_standalone_placement_puts_only_the_tenants_vms_on_its_dedicated_node(
    fleet_east, tenant, other_tenant, operator
):
    pool, node = fleet_east["pools"]["a100-standalone"], fleet_east["nodes"]["a100-001"]
    fleet.pool_set_tenants(pool=pool, tenants=[tenant, other_tenant])
    dedications.node_dedicate(node=node, tenant=tenant, actor=operator)
    theirs = request_vm(other_tenant, pool, name="g-a100", gpu_count=8)
    ours = request_vm(tenant, pool, name="a-a100", gpu_count=8)

    result = standalone.standalone_place(cluster_id=fleet_east["cluster"].pk)

    assert [p.vm_id for p in result.placed] == [ours.pk]
    assert [u.vm_id for u in result.unsatisfied] == [theirs.pk]
    assert "dedicated to other tenants" in result.unsatisfied[0].reason
    assert VirtualMachine.objects.get(pk=theirs.pk).state == State.PENDING


def test_the_snapshot_names_the_nodes_tenant_and_each_demands_tenant(
    fleet_east, tenant, other_tenant, operator
):
    pools, h100 = fleet_east["pools"], fleet_east["sets"]["h100-east"]
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[other_tenant])
    dedications.node_dedicate(node=fleet_east["nodes"]["h100-002"], tenant=tenant, actor=operator)
    request_vm(other_tenant, pools["h100-ondemand"], name="g-1", gpu_count=8)

    snapshot = capacity_set_snapshot(h100).snapshot

    assert {node.name: node.tenant for node in snapshot.nodes} == {
        "h100-001": None,
        "h100-002": "acme",
    }
    assert [(d.pool, d.tenant) for d in snapshot.demands] == [("h100-ondemand", "globex")]


def test_another_tenants_inference_replica_gets_a_notice_too(
    fleet_east, tenant, other_tenant, operator
):
    node = fleet_east["nodes"]["h100-001"]
    replica = replica_on(fleet_east, other_tenant, "h100-001", (0,), "g-replica")

    preview = dedications.node_dedicate_preview(node=node, tenant=tenant)
    applied = dedications.node_dedicate(node=node, tenant=tenant, actor=operator)

    assert [vm.pk for vm in preview.notices] == [vm.pk for vm in applied.notices] == [replica.pk]
    assert open_notices() == ["g-replica"]
