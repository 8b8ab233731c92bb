"""The live set as the arbiter sees it (gpucap.plans.snapshot): in a fixed number of queries,
with leaving VMs reserved and waiting placements kept out of the demand."""

import threading

import pytest
from django.db import connection

from gpucap import arbiter
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet, Gpu
from gpucap.plans import services, snapshot, tasks
from gpucap.plans.snapshot import capacity_set_snapshot
from gpucap.rentals import services as rentals
from gpucap.rentals.models import Allocation
from tests.rentals.conftest import sent_tasks  # noqa: F401  (fixture)
from tests.rentals.vm_helpers import request_vm, running_vm


def test_the_snapshot_is_read_in_nine_queries_whatever_the_set_size(
    h100, full_set, fleet_east, tenant, django_assert_num_queries
):
    with django_assert_num_queries(9):  # the eighth and ninth: quotas, reservations
        small = capacity_set_snapshot(h100)
    pool = fleet_east["pools"]["h100-spot"]
    for n in range(3, 9):
        node = fleet.node_create(
            cluster=fleet_east["cluster"],
            hostname=f"h100-{n:03}",
            gpu_model="H100-SXM5-80GB",
            fabric="nvswitch",
            gpu_count=8,
        )
        node = fleet.node_join_set(node=node, capacity_set=h100)
        running_vm(tenant, pool, node, [0, 1], name=f"extra-{n}", ip=f"10.51.0.{n}")
        request_vm(tenant, pool, name=f"wants-{n}", gpu_count=2)
    with django_assert_num_queries(9):
        large = capacity_set_snapshot(h100)
    assert (len(small.snapshot.nodes), len(large.snapshot.nodes)) == (2, 8)
    assert (len(small.snapshot.vms), len(large.snapshot.vms)) == (4, 10)
    assert len(large.snapshot.demands) == 6


def test_a_plans_lines_name_their_vms_without_reading_them_again(
    h100, full_set, on_demand_request, django_assert_num_queries
):
    # The snapshot loads only the VM fields it lists (snapshot.HOLDER_FIELDS); what the lines
    # and the what-if page show of each VM must be among them, or each VM costs a query.
    on_demand_request()
    snap = services.consistent_snapshot(h100)
    with django_assert_num_queries(0):
        result = arbiter.plan(snap.snapshot)
        lines = services.plan_actions(None, snap, result)
        shown = [
            (a.vm.pk, a.vm.name, a.tenant.name, a.pool.name, a.node.hostname, a.running_since)
            for a in lines
            if a.kind == "preemption"
        ]
    assert len(shown) == 2


def test_failed_gpus_and_unready_nodes_reach_the_arbiter(h100, fleet_east):
    node = fleet_east["nodes"]["h100-001"]
    fleet.gpu_set_health(gpu=Gpu.objects.get(node=node, index=3), health=Gpu.Health.FAILED)
    fleet.node_cordon(node=fleet_east["nodes"]["h100-002"])

    nodes = {n.name: n for n in capacity_set_snapshot(h100).snapshot.nodes}

    assert nodes["h100-001"].failed_gpus == (3,)
    assert nodes["h100-002"].state == "cordoned"
    assert nodes["h100-002"].partitions is not None, "its own partition table"


def test_victims_under_notice_are_reserved_and_their_beneficiary_is_no_demand(
    h100, full_set, on_demand_request, operator
):
    train = on_demand_request()
    plan = services.capacity_set_tick(capacity_set_id=h100.pk).plan
    services.plan_approve(plan=plan, actor=operator)

    snapshot = capacity_set_snapshot(h100).snapshot

    states = {vm.id: vm.state for vm in snapshot.vms}
    assert states[full_set[2].instance_id] == states[full_set[3].instance_id] == "notified"
    assert states[full_set[0].instance_id] == "running"
    assert train.instance_id not in {d.id for d in snapshot.demands}


def test_a_waiting_placement_keeps_its_vm_and_block_until_it_is_completed(
    h100, full_set, on_demand_request, operator
):
    train = on_demand_request()
    plan = services.capacity_set_tick(capacity_set_id=h100.pk).plan
    services.plan_approve(plan=plan, actor=operator)
    # Its victims are off, and no tick has completed its placement yet.
    for action in plan.actions.filter(kind="preemption"):
        rentals.vm_mark_stopped(vm=rentals.vm_stop_for_notice(vm=action.vm, message="deadline"))

    snapshot = capacity_set_snapshot(h100).snapshot

    demands = {d.id for d in snapshot.demands}
    assert train.instance_id not in demands, "its plan places it, not a new one"
    assert {full_set[2].instance_id, full_set[3].instance_id} <= demands  # resuming spot VMs
    reserved = [vm for vm in snapshot.vms if vm.id.startswith(f"{train.instance_id}/reserved")]
    assert [(vm.node, vm.gpus, vm.state) for vm in reserved] == [
        ("h100-002", (0, 1, 2, 3, 4, 5, 6, 7), "notified")
    ]


def test_a_lower_ranked_request_does_not_get_the_gpus_reserved_for_a_placement(
    h100, full_set, on_demand_request, operator, tenant, fleet_east
):
    on_demand_request()
    plan = services.capacity_set_tick(capacity_set_id=h100.pk).plan
    services.plan_approve(plan=plan, actor=operator)
    # One victim stops early (its guest acknowledged); half the partition is free.
    victim = plan.actions.filter(kind="preemption").first().vm
    rentals.vm_mark_stopped(vm=rentals.vm_stop_for_notice(vm=victim, message="ack"))
    spot = request_vm(tenant, fleet_east["pools"]["h100-spot"], name="late-spot", gpu_count=4)

    later = services.capacity_set_tick(capacity_set_id=h100.pk).plan

    assert later.placements == 0, "the freed half stays reserved for the on-demand VM"
    assert spot in {a.vm for a in later.actions.filter(kind="unsatisfied")}


def test_a_placement_whose_vm_went_away_is_marked_missed(
    h100, full_set, on_demand_request, operator
):
    train = on_demand_request()
    plan = services.capacity_set_tick(capacity_set_id=h100.pk).plan
    services.plan_approve(plan=plan, actor=operator)
    rentals.vm_terminate(vm=train)  # the tenant gave up while the victims were warned
    for action in plan.actions.filter(kind="preemption"):
        rentals.vm_mark_stopped(vm=rentals.vm_stop_for_notice(vm=action.vm, message="deadline"))

    services.capacity_set_tick(capacity_set_id=h100.pk)

    placement = plan.actions.get(kind="placement")
    assert placement.progress == "missed" and "terminated" in placement.progress_message


def test_plan_history_is_pruned_to_its_bound_keeping_the_proposal(
    h100, full_set, on_demand_request
):
    for n in range(6):
        on_demand_request(name=f"train-{n}")
        services.capacity_set_tick(capacity_set_id=h100.pk)
    proposal = h100.plans.get(status="proposed")

    deleted = services.plans_prune(keep=2)

    assert deleted == 3  # of the five superseded plans, the newest two stay
    assert h100.plans.count() == 3 and h100.plans.filter(pk=proposal.pk).exists()


def test_planning_takes_the_same_queries_for_two_victims_or_four(
    h100, full_set, on_demand_request, fleet_east
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries_to_plan() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as captured:
            plan = services.capacity_set_tick(capacity_set_id=h100.pk).plan
        return plan.preemptions, len(captured)

    assert queries_to_plan()[0] == 0  # a first plan, so each measured tick has one before it
    on_demand_request()
    two, queries_for_two = queries_to_plan()
    on_demand_request(name="train-2")
    four, queries_for_four = queries_to_plan()

    assert (two, four) == (2, 4)
    assert queries_for_two == queries_for_four


def test_a_reclaimed_spot_vm_tells_the_arbiter_where_its_disk_is(h100, fleet_east, tenant):
    pool, nodes = fleet_east["pools"]["h100-spot"], fleet_east["nodes"]
    kept = running_vm(tenant, pool, nodes["h100-002"], [0, 2], name="kept", ip="10.9.0.1")
    lost = running_vm(tenant, pool, nodes["h100-001"], [0], name="lost", ip="10.9.0.2")
    rentals.vm_stop_for_notice(vm=kept)
    rentals.vm_mark_stopped(vm=kept)
    rentals.vm_host_lost(vm=lost, reason="the hypervisor no longer knows this VM")
    new = request_vm(tenant, pool, name="new", gpu_count=1)

    demands = {d.id: d.disk_node for d in capacity_set_snapshot(h100).snapshot.demands}

    # The disk of a VM whose host was lost went with it; a new VM has none yet.
    assert demands == {kept.instance_id: "h100-002", lost.instance_id: None, new.instance_id: None}


# --- a VM that moves while the snapshot is read ---------------------------------------------------


def _stop_now(vm) -> None:
    """The owner stops ``vm`` and the hypervisor says it is off: its GPUs are free. Committed
    on a connection of its own, as another worker would."""

    def stop() -> None:
        try:
            rentals.vm_mark_stopped(vm=rentals.vm_stop(vm=vm))
        finally:
            connection.close()

    thread = threading.Thread(target=stop)
    thread.start()
    thread.join(timeout=30)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sent_tasks")
def test_a_vm_that_lets_go_of_its_gpus_while_the_snapshot_is_read_is_planned_correctly(
    h100, full_set, on_demand_request, sent_plan_tasks, monkeypatch
):
    demand = on_demand_request()
    leaving = full_set[0]  # spot-1, on h100-001's GPUs 0-3
    moved = []

    def after_the_allocations_are_read(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not moved and '"rentals_allocation"' in sql:
            moved.append(sql)
            _stop_now(leaving)  # between this query and the next ones of the snapshot
        return result

    read = snapshot.capacity_set_snapshot

    def snapshot_read_while_a_vm_moves(*args, **kwargs):
        with connection.execute_wrapper(after_the_allocations_are_read):
            return read(*args, **kwargs)

    monkeypatch.setattr(services, "capacity_set_snapshot", snapshot_read_while_a_vm_moves)

    plan = services.capacity_set_tick(capacity_set_id=h100.pk).plan

    assert moved, "the VM moved while the snapshot was read"
    assert not Allocation.objects.filter(vm=leaving, released_at=None).exists()
    # The plan is the one of the set as it is now: spot-1's GPUs are free, so one victim on
    # h100-001 completes the 8-GPU block, and spot-1 is neither a victim nor a holder.
    assert plan.generation == CapacitySet.objects.get(pk=h100.pk).generation
    victims = set(plan.actions.filter(kind="preemption").values_list("vm_id", flat=True))
    assert leaving.pk not in victims
    assert victims == {full_set[1].pk}
    fresh = arbiter.plan(capacity_set_snapshot(h100).snapshot)
    assert {p.vm for p in fresh.preemptions} == {full_set[1].instance_id}
    assert plan.actions.filter(kind="placement", vm=demand).exists()


def test_a_tick_that_fails_is_retried_and_makes_its_plan(
    h100, full_set, on_demand_request, sent_plan_tasks, monkeypatch
):
    on_demand_request()
    tick = services.capacity_set_tick
    failures = []

    def fails_once(**kwargs):
        if not failures:
            failures.append(kwargs)
            raise KeyError(42)  # what a snapshot read across a moving VM used to raise
        return tick(**kwargs)

    monkeypatch.setattr(services, "capacity_set_tick", fails_once)

    result = tasks.replan.apply(args=[h100.pk])

    assert failures
    assert result.successful(), result.traceback
    plan_id = result.get()
    assert services.latest_plan(capacity_set=h100).pk == plan_id
    assert services.latest_plan(capacity_set=h100).preemptions == 2
