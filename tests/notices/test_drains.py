"""Drains and reclaims (DESIGN.md section 4): a drain warns spot VMs and inference replicas,
never stops an on-demand VM but lists it as holding the drain up, and leaves the node cordoned
once empty; an operator reclaims one rental with a notice; all of it lands in the audit log."""

from datetime import timedelta

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet, Node
from gpucap.inference import services as inference
from gpucap.notices import drains, services, tasks
from gpucap.notices.models import InterruptionNotice
from gpucap.notices.selectors import drain_blockers
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.rentals.conftest import SSH_KEY
from tests.rentals.vm_helpers import world

State = VirtualMachine.State
Reason = InterruptionNotice.Reason


def replica_on(fleet_east, tenant, node: str, gpus: tuple[int, ...], name: str):
    """A running replica of an inference deployment in pool h100-inference."""
    pool = fleet_east["pools"]["h100-inference"]
    pool.tenants.add(tenant)
    deployment = inference.deployment_create(
        tenant=tenant,
        pool=pool,
        name=f"{name}-serving",
        model_name="gpucap/sim-8b",
        gpus_per_replica=len(gpus),
        min_replicas=0,
        max_replicas=4,
    )
    vm = rentals.vm_request(
        tenant=tenant,
        pool=pool,
        name=name,
        gpu_count=len(gpus),
        image="gpucap-model-server",
        ssh_public_key=SSH_KEY,
        role=VirtualMachine.Role.INFERENCE_REPLICA,
        deployment=deployment,
    )
    rentals.vm_place(vm=vm, node=fleet_east["nodes"][node], gpu_indices=gpus)
    return rentals.vm_mark_running(vm=vm, ip_address="10.200.1.1")


@pytest.fixture
def busy_node(fleet_east, tenant, vm_in, sent_tasks):
    """h100-001 with a spot VM, an inference replica and an on-demand VM on it."""
    return {
        "node": fleet_east["nodes"]["h100-001"],
        "spot": vm_in("running", pool="h100-spot", gpus=(0,)),
        "replica": replica_on(fleet_east, tenant, "h100-001", (1,), "replica-1"),
        "on_demand": vm_in("running", pool="h100-ondemand", gpus=(2,)),
    }


def node_state(node: Node) -> str:
    return Node.objects.get(pk=node.pk).state


def open_notice(vm: VirtualMachine) -> InterruptionNotice | None:
    return InterruptionNotice.objects.filter(vm=vm, completed_at=None).first()


def stop_for_good(vm: VirtualMachine) -> None:
    """What the deadline and the stop task do, one after the other."""
    notice = open_notice(vm)
    services.notice_deadline_reached(notice=notice, now=notice.deadline)
    rentals.vm_mark_stopped(vm=vm)


def test_a_drain_warns_spot_vms_and_replicas_and_leaves_on_demand_running(busy_node, operator):
    node = drains.node_drain(node=busy_node["node"], actor=operator)

    assert node.state == Node.State.DRAINING
    for kind in ("spot", "replica"):
        vm = VirtualMachine.objects.get(pk=busy_node[kind].pk)
        assert vm.state == State.NOTIFIED, kind
        notice = open_notice(vm)
        assert notice.reason == Reason.DRAIN
        assert notice.deadline - notice.issued_at == timedelta(seconds=120)  # the set's
        assert notice.issued_by == operator
    on_demand = VirtualMachine.objects.get(pk=busy_node["on_demand"].pk)
    assert on_demand.state == State.RUNNING
    assert open_notice(on_demand) is None


def test_the_drain_lists_who_holds_it_up(busy_node, operator, tenant):
    drains.node_drain(node=busy_node["node"], actor=operator)

    blockers = {b.vm.pk: b for b in drain_blockers(busy_node["node"])}

    assert set(blockers) == {busy_node[k].pk for k in ("spot", "replica", "on_demand")}
    held_up = blockers[busy_node["on_demand"].pk]
    assert held_up.waiting_for == "on_demand"
    assert "never stops it" in held_up.explanation
    assert held_up.vm.tenant == tenant
    assert held_up.vm.pool.name == "h100-ondemand"
    assert held_up.since == busy_node["on_demand"].started_at
    assert blockers[busy_node["spot"].pk].waiting_for == "notice"
    assert blockers[busy_node["spot"].pk].notice == open_notice(busy_node["spot"])


def test_drain_blockers_take_a_fixed_number_of_queries(
    busy_node,
    operator,
    django_assert_num_queries,
    vm_in,
):
    node = busy_node["node"]
    with django_assert_num_queries(2):
        assert len(drain_blockers(node)) == 3
    vm_in("running", pool="h100-ondemand", gpus=(3,))
    vm_in("running", pool="h100-spot", gpus=(4,))
    drains.node_drain(node=node, actor=operator)
    with django_assert_num_queries(2):
        assert len(drain_blockers(node)) == 5


def test_the_node_ends_cordoned_when_its_last_vm_stops(
    busy_node, operator, django_capture_on_commit_callbacks
):
    node = busy_node["node"]
    with django_capture_on_commit_callbacks(execute=True):
        drains.node_drain(node=node, actor=operator)
    with django_capture_on_commit_callbacks(execute=True):
        stop_for_good(busy_node["spot"])
        stop_for_good(busy_node["replica"])
    assert node_state(node) == Node.State.DRAINING  # the on-demand VM holds it
    assert [b.vm.pk for b in drain_blockers(node)] == [busy_node["on_demand"].pk]

    with django_capture_on_commit_callbacks(execute=True):
        rentals.vm_stop(vm=busy_node["on_demand"])  # its owner, in their own time
        rentals.vm_mark_stopped(vm=busy_node["on_demand"])

    assert node_state(node) == Node.State.CORDONED
    assert drain_blockers(node) == []
    done = AuditEvent.objects.get(object_type="node", object_id=str(node.pk), verb="node.cordon")
    assert "drain complete" in done.message
    assert VirtualMachine.objects.get(pk=busy_node["spot"].pk).state == State.PENDING  # resumes
    # A replica is withdrawn for good: its deployment asks for a new one elsewhere.
    assert VirtualMachine.objects.get(pk=busy_node["replica"].pk).state == State.TERMINATED


def test_the_sweep_cordons_an_emptied_node_whose_check_was_lost(busy_node, operator):
    node = busy_node["node"]
    drains.node_drain(node=node, actor=operator)
    # Post-commit checks never run in this test: as if the process died right after commit.
    stop_for_good(busy_node["spot"])
    stop_for_good(busy_node["replica"])
    rentals.vm_stop(vm=busy_node["on_demand"])
    rentals.vm_mark_stopped(vm=busy_node["on_demand"])
    assert node_state(node) == Node.State.DRAINING

    tasks.sweep()

    assert node_state(node) == Node.State.CORDONED


def test_a_vm_still_booting_when_the_drain_began_is_warned_once_it_runs(
    fleet_east,
    vm_in,
    operator,
):
    node = fleet_east["nodes"]["h100-001"]
    booting = vm_in("provisioning", gpus=(0,))
    drains.node_drain(node=node, actor=operator)
    assert [b.waiting_for for b in drain_blockers(node)] == ["starting"]

    rentals.vm_mark_running(vm=booting, ip_address="10.200.0.5")
    tasks.sweep()

    assert open_notice(booting).reason == Reason.DRAIN
    assert node_state(node) == Node.State.DRAINING


def test_draining_an_empty_node_cordons_it_at_once(fleet_east, operator):
    node = drains.node_drain(node=fleet_east["nodes"]["h100-002"], actor=operator)

    assert node.state == Node.State.CORDONED
    verbs = AuditEvent.objects.filter(object_type="node", object_id=str(node.pk))
    assert list(verbs.order_by("pk").values_list("verb", flat=True))[-2:] == [
        "node.drain",
        "node.cordon",
    ]


def test_draining_twice_keeps_the_notices_and_their_deadlines(busy_node, operator):
    drains.node_drain(node=busy_node["node"], actor=operator)
    first = open_notice(busy_node["spot"])

    drains.node_drain(node=busy_node["node"], actor=operator)

    assert InterruptionNotice.objects.filter(vm=busy_node["spot"]).count() == 1
    assert open_notice(busy_node["spot"]).deadline == first.deadline


def test_a_drain_bumps_the_sets_generation(busy_node, operator):
    capacity_set = busy_node["node"].capacity_set
    before = CapacitySet.objects.get(pk=capacity_set.pk).generation

    drains.node_drain(node=busy_node["node"], actor=operator)

    assert CapacitySet.objects.get(pk=capacity_set.pk).generation > before


def test_uncordon_cancels_a_drain_and_notices_sent_keep_their_deadlines(busy_node, operator):
    drains.node_drain(node=busy_node["node"], actor=operator)
    notice = open_notice(busy_node["spot"])

    fleet.node_uncordon(node=busy_node["node"], actor=operator)

    assert node_state(busy_node["node"]) == Node.State.READY
    assert open_notice(busy_node["spot"]).deadline == notice.deadline


def test_draining_a_down_node_is_refused_and_changes_nothing(busy_node, operator):
    node = busy_node["node"]
    fleet.node_set_state(node=node, state=Node.State.DOWN, actor=operator)
    before = world()

    with pytest.raises(Conflict, match="is down") as refused:
        drains.node_drain(node=node, actor=operator)

    assert refused.value.code == "node_down"
    assert node_state(node) == Node.State.DOWN
    assert world() == before
    assert not InterruptionNotice.objects.exists()


def test_draining_a_set_drains_each_node_and_leaves_down_nodes_alone(
    fleet_east,
    vm_in,
    operator,
):
    capacity_set = fleet_east["sets"]["h100-east"]
    spot = vm_in("running", pool="h100-spot", node="h100-001", gpus=(0,))
    down = fleet_east["nodes"]["h100-002"]
    fleet.node_set_state(node=down, state=Node.State.DOWN, actor=operator)

    drained = drains.capacity_set_drain(capacity_set=capacity_set, actor=operator)

    assert [n.hostname for n in drained] == ["h100-001"]
    assert node_state(fleet_east["nodes"]["h100-001"]) == Node.State.DRAINING
    assert node_state(down) == Node.State.DOWN
    assert open_notice(spot).reason == Reason.DRAIN
    event = AuditEvent.objects.get(verb="capacity_set.drain", object_id=str(capacity_set.pk))
    assert event.actor == operator
    assert event.after == {"nodes": ["h100-001"], "skipped_down": ["h100-002"]}


def test_draining_a_set_without_nodes_is_refused(fleet_east, operator):
    empty = fleet.capacity_set_create(
        cluster=fleet_east["cluster"], name="b200-east", gpu_model="B200", fabric="nvswitch"
    )
    events = AuditEvent.objects.count()

    with pytest.raises(Conflict, match="has no nodes"):
        drains.capacity_set_drain(capacity_set=empty, actor=operator)

    assert AuditEvent.objects.count() == events


def test_an_operator_reclaims_an_on_demand_rental_with_a_notice(vm_in, operator):
    vm = vm_in("running", pool="h100-ondemand")

    notice = drains.vm_reclaim(vm=vm, actor=operator, message="hardware maintenance")

    assert notice.reason == Reason.RECLAIM
    assert notice.message == "hardware maintenance"
    assert VirtualMachine.objects.get(pk=vm.pk).state == State.NOTIFIED
    event = AuditEvent.objects.get(object_id=str(vm.pk), verb="notice.reclaim")
    assert event.actor == operator
    services.notice_deadline_reached(notice=notice, now=notice.deadline)
    rentals.vm_mark_stopped(vm=vm)
    assert VirtualMachine.objects.get(pk=vm.pk).state == State.STOPPED  # on-demand: no resume


def test_reclaiming_a_vm_that_is_not_running_is_refused(vm_in, operator):
    vm = vm_in("pending")
    before = world()

    with pytest.raises(Conflict, match="only a running VM"):
        drains.vm_reclaim(vm=vm, actor=operator)

    assert world() == before


def test_every_drain_and_notice_is_in_the_audit_log_with_its_actor(busy_node, operator):
    drains.node_drain(node=busy_node["node"], actor=operator)

    drain = AuditEvent.objects.get(verb="node.drain", object_id=str(busy_node["node"].pk))
    assert drain.actor == operator
    notices = AuditEvent.objects.filter(verb="notice.drain").order_by("object_id")
    assert [int(e.object_id) for e in notices] == sorted(
        [busy_node["spot"].pk, busy_node["replica"].pk]
    )
    assert {e.actor for e in notices} == {operator}
