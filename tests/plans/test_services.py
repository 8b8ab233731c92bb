"""Plans on the live fleet: dry-run previews, Approve, enforcement, completion of approved
placements, what-if (DESIGN.md section 8)."""

import pytest
from django.core.exceptions import ValidationError

from gpucap.audit.models import AuditEvent
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import request_vm, world

State = VirtualMachine.State
Kind = PlanAction.Kind


def tick(capacity_set) -> Plan:
    return services.capacity_set_tick(capacity_set_id=capacity_set.pk).plan


def victims_of(plan: Plan) -> list[str]:
    return sorted(
        a.vm.instance_id for a in plan.actions.filter(kind=Kind.PREEMPTION).select_related("vm")
    )


def stop_victims(plan: Plan) -> None:
    """The victims' notices run out and the driver reports them off."""
    for action in plan.actions.filter(kind=Kind.PREEMPTION):
        vm = rentals.vm_stop_for_notice(vm=action.vm, message="deadline")
        rentals.vm_mark_stopped(vm=vm)


def test_dry_run_plan_names_the_spot_victims_and_changes_nothing(h100, full_set, on_demand_request):
    train = on_demand_request()
    before = world()

    plan = tick(h100)

    assert plan.status == Plan.Status.PROPOSED and plan.mode == CapacitySet.Mode.DRY_RUN
    assert plan.complete and (plan.placements, plan.preemptions, plan.preempted_gpus) == (1, 2, 8)
    placement = plan.actions.get(kind=Kind.PLACEMENT)
    assert placement.vm == train and placement.gpus == [0, 1, 2, 3, 4, 5, 6, 7]
    # Least disruption: the two most recently started spot VMs, which share one node.
    assert victims_of(plan) == sorted([full_set[2].instance_id, full_set[3].instance_id])
    assert placement.node.hostname == "h100-002"
    preemption = plan.actions.filter(kind=Kind.PREEMPTION).first()
    assert preemption.tenant.slug == "acme" and preemption.pool.name == "h100-spot"
    assert preemption.for_vm == train and preemption.running_since is not None
    assert "h100-ondemand" in preemption.reason
    spot = next(p for p in plan.pools if p["name"] == "h100-spot")
    assert (spot["before_gpus"], spot["after_gpus"]) == (16, 8)
    ondemand = next(p for p in plan.pools if p["name"] == "h100-ondemand")
    assert (ondemand["pending_gpus"], ondemand["after_gpus"]) == (8, 8)
    assert world() == before, "a dry-run plan changes nothing"
    assert not InterruptionNotice.objects.exists()


def test_a_set_that_did_not_change_is_not_planned_again(h100, full_set, on_demand_request):
    on_demand_request()
    first = tick(h100)
    assert tick(h100) == first
    assert Plan.objects.filter(capacity_set=h100).count() == 1


def test_a_new_plan_supersedes_the_proposal(h100, full_set, on_demand_request):
    on_demand_request()
    first = tick(h100)
    on_demand_request(name="train-2")
    second = tick(h100)
    first.refresh_from_db()
    assert first.status == Plan.Status.SUPERSEDED and second.status == Plan.Status.PROPOSED
    assert second.generation > first.generation


def test_a_plan_with_nothing_to_do_is_stored_once_and_identical_replans_fold_into_it(
    h100, full_set, on_demand_request, operator
):
    """Under enforcement a set with nothing to place is replanned at every change: none of
    those replans adds a row, an apply or an audit event; the plan counts them."""
    services.capacity_set_set_mode(capacity_set=h100, mode="enforce", actor=operator)
    first = tick(h100)
    assert first.status == Plan.Status.NOTHING and not first.has_actions
    audited = AuditEvent.objects.filter(verb="plan.enforce").count()

    for _ in range(3):
        # A change that bumps the generation but leaves the plan doing nothing.
        node = h100.nodes.get(hostname="h100-001")
        fleet.node_cordon(node=node, actor=operator)
        fleet.node_uncordon(node=node, actor=operator)
        again = tick(h100)
        assert again.pk == first.pk

    first.refresh_from_db()
    h100.refresh_from_db()
    assert Plan.objects.filter(capacity_set=h100).count() == 1
    assert first.status == Plan.Status.NOTHING and first.applied_at is None
    assert first.replans == 3 and first.replanned_at > first.created_at
    assert first.generation == h100.generation, "it stands for the set as it is now"
    assert AuditEvent.objects.filter(verb="plan.enforce").count() == audited


def test_a_plan_that_does_something_after_nothing_is_a_new_row_and_so_is_nothing_after_it(
    h100, full_set, on_demand_request, operator
):
    idle = tick(h100)
    train = on_demand_request()
    proposal = tick(h100)
    assert proposal.pk != idle.pk and proposal.status == Plan.Status.PROPOSED
    rentals.vm_terminate(vm=train, actor=operator)  # the request is withdrawn
    back_to_idle = tick(h100)
    proposal.refresh_from_db()
    assert back_to_idle.pk not in (idle.pk, proposal.pk)
    assert back_to_idle.status == Plan.Status.NOTHING
    assert proposal.status == Plan.Status.SUPERSEDED


def test_approving_a_plan_with_nothing_to_do_is_refused_and_changes_nothing(h100, operator):
    idle = tick(h100)
    with pytest.raises(Conflict) as refused:
        services.plan_approve(plan=idle, actor=operator)
    assert refused.value.code == "plan_nothing_to_apply"
    assert "places no demand and notifies no VM" in refused.value.message
    idle.refresh_from_db()
    assert idle.status == Plan.Status.NOTHING and idle.approved_by is None
    assert not AuditEvent.objects.filter(verb__startswith="plan.approve").exists()


def test_approve_sends_notices_and_places_once_the_victims_are_off(
    h100, full_set, on_demand_request, operator
):
    train = on_demand_request()
    plan = tick(h100)

    services.plan_approve(plan=plan, actor=operator)

    plan.refresh_from_db()
    assert plan.status == Plan.Status.APPLIED and plan.approved_by == operator
    notices = InterruptionNotice.objects.filter(plan=plan).select_related("vm")
    assert sorted(n.vm.instance_id for n in notices) == victims_of(plan)
    assert all(n.reason == "arbiter" for n in notices)
    assert all((n.deadline - n.issued_at).total_seconds() == h100.notice_seconds for n in notices)
    assert all(n.vm.state == State.NOTIFIED and n.vm.preempted_for == train for n in notices)
    train.refresh_from_db()
    assert train.state == State.PENDING, "it waits for its victims"
    assert plan.actions.get(kind=Kind.PLACEMENT).progress == PlanAction.Progress.WAITING
    assert AuditEvent.objects.filter(verb="plan.approve", actor=operator).exists()

    # While they stop, later plans give the reserved GPUs to nobody else and notify no one.
    later = tick(h100)
    assert later.preemptions == 0 and later.placements == 0

    stop_victims(plan)
    tick(h100)

    train.refresh_from_db()
    assert train.state == State.PROVISIONING and train.node.hostname == "h100-002"
    assert sorted(train.allocations.values_list("gpu__index", flat=True)) == list(range(8))
    assert plan.actions.get(kind=Kind.PLACEMENT).progress == PlanAction.Progress.DONE
    # The spot victims resume: pending again, waiting for capacity.
    assert sorted(
        VirtualMachine.objects.filter(state=State.PENDING).values_list("name", flat=True)
    ) == ["spot-3", "spot-4"]


def test_victims_going_off_while_a_tick_runs_leave_the_placement_to_the_plan_that_made_it(
    h100, full_set, on_demand_request, operator, monkeypatch
):
    """A tick completes waiting placements, then plans, in two transactions: the last victim
    may go off between them (issue 22). The plan made then neither places the VM again nor
    gives its block to the victims now pending; the next tick places it under the plan that
    notified its victims, and that plan alone records the placement."""
    services.capacity_set_set_mode(capacity_set=h100, mode="enforce", actor=operator)
    train = on_demand_request()
    first = tick(h100)
    assert first.actions.get(kind=Kind.PLACEMENT).progress == PlanAction.Progress.WAITING
    complete = services.placements_complete

    def victims_go_off_right_after(*, capacity_set):
        placed = complete(capacity_set=capacity_set)
        stop_victims(first)
        return placed

    monkeypatch.setattr(services, "placements_complete", victims_go_off_right_after)
    between = tick(h100)
    monkeypatch.setattr(services, "placements_complete", complete)

    assert between.status == Plan.Status.NOTHING
    assert (between.placements, between.preemptions) == (0, 0), "the block stays reserved"
    assert VirtualMachine.objects.filter(state=State.PROVISIONING).count() == 0
    tick(h100)
    train.refresh_from_db()
    assert train.state == State.PROVISIONING and train.node.hostname == "h100-002"
    placement = first.actions.get(kind=Kind.PLACEMENT)
    assert placement.progress == PlanAction.Progress.DONE, placement.progress_message
    assert list(PlanAction.objects.filter(kind=Kind.PLACEMENT, vm=train)) == [placement]


def test_approving_twice_sends_nothing_twice(h100, full_set, on_demand_request, operator):
    on_demand_request()
    plan = tick(h100)
    services.plan_approve(plan=plan, actor=operator)
    notices = InterruptionNotice.objects.count()

    with pytest.raises(Conflict) as refused:
        services.plan_approve(plan=plan, actor=operator)

    assert refused.value.code == "plan_already_applied"
    assert InterruptionNotice.objects.count() == notices == 2


def test_approve_refuses_a_stale_plan_and_makes_the_fresh_one(
    h100, full_set, on_demand_request, operator
):
    on_demand_request()
    seen = tick(h100)
    on_demand_request(name="train-2")  # the set changes after the operator looked
    before = world()

    with pytest.raises(services.StalePlan) as refused:
        services.plan_approve(plan=seen, actor=operator)

    fresh = refused.value.fresh
    assert refused.value.code == "stale_plan" and fresh.pk != seen.pk
    assert fresh.status == Plan.Status.PROPOSED and fresh.generation > seen.generation
    assert fresh.demands == 2 and fresh.placements == 2 and fresh.preemptions == 4
    assert not InterruptionNotice.objects.exists()
    assert world()["vms"] == before["vms"] and world()["allocations"] == before["allocations"]
    changes = services.plan_changes(seen, fresh)
    assert any("now places" in line for line in changes), changes
    assert AuditEvent.objects.filter(verb="plan.approve_refused").exists()


def test_enforcement_applies_each_new_plan_without_a_click(
    h100, full_set, on_demand_request, operator
):
    services.capacity_set_set_mode(capacity_set=h100, mode="enforce", actor=operator)
    train = on_demand_request()

    plan = tick(h100)

    assert plan.status == Plan.Status.APPLIED and plan.approved_by is None
    assert InterruptionNotice.objects.filter(plan=plan).count() == 2
    train.refresh_from_db()
    assert train.preempted_for is None and train.victims.count() == 2
    assert AuditEvent.objects.filter(verb="capacity_set.mode", actor=operator).exists()
    assert AuditEvent.objects.filter(verb="plan.enforce").exists()


def test_enforcement_places_on_free_capacity_at_once(h100, full_set, operator, fleet_east):
    services.capacity_set_set_mode(capacity_set=h100, mode="enforce", actor=operator)
    stop_victims_of = full_set[0]
    rentals.vm_stop(vm=stop_victims_of)
    rentals.vm_mark_stopped(vm=stop_victims_of)  # frees GPUs 0-3 of h100-001
    small = request_vm(
        fleet_east["pools"]["h100-spot"].tenants.first(),
        fleet_east["pools"]["h100-spot"],
        name="small",
        gpu_count=4,
    )

    plan = tick(h100)

    small.refresh_from_db()
    assert plan.status == Plan.Status.APPLIED and plan.preemptions == 0
    assert small.state == State.PROVISIONING and small.node.hostname == "h100-001"


def test_back_in_dry_run_notices_keep_their_deadlines_and_nothing_new_happens(
    h100, full_set, on_demand_request, operator
):
    services.capacity_set_set_mode(capacity_set=h100, mode="enforce", actor=operator)
    on_demand_request()
    applied = tick(h100)
    deadlines = list(InterruptionNotice.objects.values_list("deadline", flat=True))

    services.capacity_set_set_mode(capacity_set=h100, mode="dry_run", actor=operator)
    on_demand_request(name="train-2")
    proposed = tick(h100)

    assert proposed.status == Plan.Status.PROPOSED and proposed.preemptions == 2
    assert list(InterruptionNotice.objects.values_list("deadline", flat=True)) == deadlines
    # The approved placement still completes once its victims are off.
    stop_victims(applied)
    tick(h100)
    assert VirtualMachine.objects.get(name="train-1").state == State.PROVISIONING
    assert VirtualMachine.objects.get(name="train-2").state == State.PENDING


def test_a_booting_victim_is_stopped_without_notice(h100, full_set, on_demand_request, operator):
    for vm in full_set[2:]:  # make the most recent victims still be booting
        VirtualMachine.objects.filter(pk=vm.pk).update(state=State.PROVISIONING)
    on_demand_request()
    plan = tick(h100)

    services.plan_approve(plan=plan, actor=operator)

    assert not InterruptionNotice.objects.exists()
    assert set(
        VirtualMachine.objects.filter(pk__in=[full_set[2].pk, full_set[3].pk]).values_list(
            "state", "stop_reason"
        )
    ) == {(State.STOPPING, VirtualMachine.StopReason.PREEMPTED)}


def test_mode_change_is_validated_and_audited(h100, operator):
    before = AuditEvent.objects.count()
    with pytest.raises(ValidationError) as bad:
        services.capacity_set_set_mode(capacity_set=h100, mode="yolo", actor=operator)
    assert "mode" in bad.value.message_dict
    assert AuditEvent.objects.count() == before
    services.capacity_set_set_mode(capacity_set=h100, mode="enforce", actor=operator)
    h100.refresh_from_db()
    assert h100.mode == "enforce"


def test_what_if_previews_a_reclaim_without_storing_or_changing_anything(
    h100, full_set, fleet_east
):
    before = world()
    what_if = services.plan_what_if(
        capacity_set=h100, pool=fleet_east["pools"]["h100-ondemand"], gpus=8, block_gpus=4
    )
    assert what_if.served and what_if.reclaimed_gpus == 8
    assert {a.vm.name for a in what_if.reclaimed} == {"spot-3", "spot-4"}
    assert not Plan.objects.exists()
    assert world() == before


def _what_if_lines(actions) -> list[tuple]:
    return [(a.kind, a.subject, a.node_id, list(a.gpus), a.reason) for a in actions]


def _fresh_what_if(capacity_set, pool, gpus: int, block_gpus: int):
    """What a fresh read of the set plans with the what-if's blocks queued last."""
    from datetime import timedelta

    from django.utils import timezone

    from gpucap import arbiter
    from gpucap.arbiter import model as am

    now = timezone.now()
    extra = [
        am.Demand(
            id=f"what-if-{n}",
            group="what-if",
            pool=pool.name,
            gpus=block_gpus,
            requested_at=now + timedelta(microseconds=n),
        )
        for n in range(1, gpus // block_gpus + 1)
    ]
    snap = services.consistent_snapshot(capacity_set, extra_demands=extra)
    result = arbiter.plan(snap.snapshot)
    return services.plan_actions(None, snap, result), services.pool_balances(snap, result)


def test_what_if_answers_as_a_fresh_plan_of_the_set_now_however_often_it_is_asked(
    h100, full_set, fleet_east, on_demand_request
):
    ondemand = fleet_east["pools"]["h100-ondemand"]

    def asked(gpus: int, block_gpus: int):
        answers = [
            services.plan_what_if(
                capacity_set=h100, pool=ondemand, gpus=gpus, block_gpus=block_gpus
            )
            for _ in range(2)
        ]
        actions, pools = _fresh_what_if(h100, ondemand, gpus, block_gpus)
        for answer in answers:
            assert _what_if_lines(answer.actions) == _what_if_lines(actions)
            assert answer.pools == pools
        return answers[-1]

    first = asked(8, 4)
    assert {a.vm.name for a in first.reclaimed} == {"spot-3", "spot-4"}
    on_demand_request()  # pending now: 8 GPUs ahead of the what-if's
    second = asked(8, 4)
    assert {a.vm.name for a in second.reclaimed} == {"spot-1", "spot-2"}
    fleet.node_cordon(node=fleet_east["nodes"]["h100-001"])
    third = asked(8, 4)
    assert not third.served


@pytest.mark.parametrize(
    ("gpus", "block_gpus", "field"),
    [(8, 3, "block_gpus"), (6, 4, "gpus"), (0, 1, "gpus"), (64, 8, "gpus"), ("8", 8, "gpus")],
)
def test_what_if_names_the_bad_field(h100, fleet_east, gpus, block_gpus, field):
    with pytest.raises(ValidationError) as bad:
        services.plan_what_if(
            capacity_set=h100,
            pool=fleet_east["pools"]["h100-ondemand"],
            gpus=gpus,
            block_gpus=block_gpus,
        )
    assert field in bad.value.message_dict


def test_what_if_refuses_a_pool_of_another_set(h100, fleet_east):
    with pytest.raises(ValidationError) as bad:
        services.plan_what_if(
            capacity_set=h100, pool=fleet_east["pools"]["l40s-ondemand"], gpus=1, block_gpus=1
        )
    assert "pool" in bad.value.message_dict


def test_floor_change_triggers_one_debounced_replan(
    h100, fleet_east, sent_plan_tasks, django_capture_on_commit_callbacks
):
    from gpucap.plans.triggers import replan_release

    replan_release(h100.pk)
    with django_capture_on_commit_callbacks(execute=True):
        fleet.pool_set_floor(pool=fleet_east["pools"]["h100-spot"], floor_gpus=2)
        fleet.node_cordon(node=fleet_east["nodes"]["h100-001"])
    with django_capture_on_commit_callbacks(execute=True):
        fleet.node_uncordon(node=fleet_east["nodes"]["h100-001"])
    assert sent_plan_tasks == [("plans.replan", [h100.pk])]
    replan_release(h100.pk)


def test_a_change_to_a_quiet_set_is_planned_at_once_and_ticks_keep_their_interval(
    h100, fleet_east, monkeypatch, settings, django_capture_on_commit_callbacks
):
    from gpucap.celery import app
    from gpucap.plans import triggers
    from gpucap.redis_clients import shared_redis

    settings.PLANS_DEBOUNCE_SECONDS = 5
    shared_redis().delete(triggers._key(h100.pk), triggers._started_key(h100.pk))
    sent = []
    monkeypatch.setattr(
        app, "send_task", lambda name, args=None, **options: sent.append((name, options))
    )
    spot = fleet_east["pools"]["h100-spot"]
    with django_capture_on_commit_callbacks(execute=True):
        fleet.pool_set_floor(pool=spot, floor_gpus=2)
    assert sent == [("plans.replan", {"countdown": 0})]  # nothing planned lately: at once
    triggers.replan_release(h100.pk)  # the tick starts
    with django_capture_on_commit_callbacks(execute=True):
        fleet.pool_set_floor(pool=spot, floor_gpus=3)
    with django_capture_on_commit_callbacks(execute=True):
        fleet.pool_set_floor(pool=spot, floor_gpus=4)
    assert len(sent) == 2  # the burst after the tick started gives one more tick
    assert 4 < sent[1][1]["countdown"] <= 5  # five seconds after the last one started
    shared_redis().delete(triggers._key(h100.pk), triggers._started_key(h100.pk))
