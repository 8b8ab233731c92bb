"""The plan at a later instant on today's fleet (gpucap/plans/future.py): what a schedule's
boundary would make the arbiter do, computed before it comes, storing and changing nothing."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpucap.audit.models import AuditEvent
from gpucap.fleet.models import CapacitySet
from gpucap.inference import services as inference
from gpucap.plans import future, snapshot_cache
from gpucap.plans import services as plans
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals.models import VirtualMachine
from gpucap.schedules import services as schedules
from gpucap.schedules.models import AppliedPolicy
from gpucap.schedules.selectors import set_schedule
from tests.schedules.conftest import NOON, day_shift

pytestmark = pytest.mark.django_db

OPENS = NOON + timedelta(hours=1)  # 08:00 in New York
CLOSES = NOON + timedelta(hours=13)  # 20:00 in New York


def _world(capacity_set) -> tuple:
    return (
        Plan.objects.count(),
        PlanAction.objects.count(),
        VirtualMachine.objects.count(),
        sorted(VirtualMachine.objects.values_list("state", flat=True)),
        AuditEvent.objects.count(),
        CapacitySet.objects.get(pk=capacity_set.pk).generation,
    )


def test_a_raised_minimum_at_t_names_exactly_the_spot_vms_a_dry_run_then_would(
    h100, full_set, chat, operator
):
    entry = day_shift(deployments={"acme-chat": {"min_replicas": 2}})
    schedules.schedule_entry_save(capacity_set=h100, data=entry, actor=operator, now=NOON)

    before_opening = future.plan_at(h100, NOON)
    at_opening = future.plan_at(h100, OPENS)

    assert before_opening.victims == () and before_opening.served == []
    assert at_opening.policy.replicas["acme-chat"] == (2, 4)
    served = [s.demand for s in at_opening.served]
    assert served == ["scheduled-acme-chat-1", "scheduled-acme-chat-2"]
    assert all(s.pool == "h100-inference" and len(s.gpus) == 4 for s in at_opening.served)
    foreseen = sorted(victim.vm for victim in at_opening.victims)
    assert len(foreseen) == 2 and at_opening.victim_gpus == 8
    assert {victim.tenant for victim in at_opening.victims} == {"acme"}
    assert {victim.pool for victim in at_opening.victims} == {"h100-spot"}

    # Then the boundary really passes: the minimum is put in force, the autoscaler asks for the
    # two replicas, and the set's dry-run plan notifies the very VMs foreseen.
    schedules.policy_apply(capacity_set=h100, now=OPENS)
    chat.refresh_from_db()
    assert chat.min_replicas_in_force == 2
    inference.replicas_scale(deployment=chat, to=2, reason="schedule")
    plan = plans.capacity_set_tick(capacity_set_id=h100.pk).plan
    notified = sorted(
        action.vm.instance_id
        for action in plan.actions.filter(kind=PlanAction.Kind.PREEMPTION).select_related("vm")
    )
    assert notified == foreseen


def test_the_plan_at_a_later_time_stores_and_changes_nothing(h100, full_set, chat, operator):
    entry = day_shift(
        deployments={"acme-chat": {"min_replicas": 2}},
        pools={"h100-inference": {"floor_gpus": 8}},
    )
    schedules.schedule_entry_save(capacity_set=h100, data=entry, actor=operator, now=NOON)
    before = _world(h100)

    future.plan_at(h100, OPENS)
    future.timeline(h100, NOON)

    assert _world(h100) == before
    chat.refresh_from_db()
    assert chat.scheduled_min_replicas is None  # 07:00 in New York: nothing in force yet


def test_the_timeline_names_each_boundary_what_changes_and_who_would_be_notified(
    h100, full_set, chat, operator
):
    entry = day_shift(deployments={"acme-chat": {"min_replicas": 2}})
    schedules.schedule_entry_save(capacity_set=h100, data=entry, actor=operator, now=NOON)

    opening, closing = future.timeline(h100, NOON)

    assert (opening.at, closing.at) == (OPENS, CLOSES)
    assert opening.events == [('entry "day-shift" opens', "Wed 08:00 America/New_York")]
    assert opening.changes == ["deployment acme-chat replicas 0-4 → 2-4"]
    assert len(opening.future.victims) == 2
    assert closing.events == [('entry "day-shift" closes', "Wed 20:00 America/New_York")]
    assert closing.changes == ["deployment acme-chat replicas 2-4 → 0-4"]
    assert closing.future.victims == () and closing.future.served == []
    assert future.timeline(h100, NOON, hours=0) == []


def test_an_override_shows_in_the_timeline_with_who_set_it(h100, full_set, chat, operator):
    schedules.policy_override_set(
        capacity_set=h100,
        data={"name": "peak", "pools": {"h100-inference": {"floor_gpus": 8}}, "ttl_seconds": 3600},
        actor=operator,
        now=NOON,
    )

    (expiry,) = future.timeline(h100, NOON)

    assert expiry.at == NOON + timedelta(hours=1)
    assert expiry.events == [('override "peak" (set by olivia) expires', "Wed 13:00 UTC")]
    assert expiry.changes == ["pool h100-inference floor 8 → 4 GPUs"]


def test_the_timeline_reads_the_fleet_once_whatever_the_number_of_boundaries(
    h100, full_set, chat, operator
):
    entry = day_shift(deployments={"acme-chat": {"min_replicas": 2}})
    schedules.schedule_entry_save(capacity_set=h100, data=entry, actor=operator, now=NOON)

    def queries() -> tuple[int, int]:
        snapshot_cache.forget()
        with CaptureQueriesContext(connection) as counted:
            found = future.timeline(h100, NOON, hours=48)
        return len(found), len(counted)

    few = queries()
    for hour in range(3):
        schedules.schedule_entry_save(
            capacity_set=h100,
            data={
                "name": f"burst-{hour}",
                "days": "every day",
                "start": f"{2 + hour * 2:02d}:00",
                "end": f"{3 + hour * 2:02d}:00",
                "time_zone": "UTC",
                "pools": {"h100-ondemand": {"floor_gpus": 4}},
            },
            actor=operator,
            now=NOON,
        )
    many = queries()

    assert many[0] > few[0]
    assert many[1] == few[1]


def test_an_entry_handing_over_to_another_with_the_same_values_is_no_boundary(
    h100, full_set, operator
):
    """06:00-08:00 and then 08:00-20:00 keep inference's floor at 8: nothing changes at 08:00,
    so the timeline leaves that moment out and no wake-up is sent for it."""
    floor = {"pools": {"h100-inference": {"floor_gpus": 8}}}
    early = {**day_shift(**floor), "name": "early", "start": "06:00", "end": "08:00"}
    schedules.schedule_entry_save(capacity_set=h100, data=early, actor=operator, now=NOON)
    schedules.schedule_entry_save(
        capacity_set=h100, data=day_shift(**floor), actor=operator, now=NOON
    )

    found = future.timeline(h100, NOON)

    thursday_six = NOON + timedelta(hours=23)  # Thu 06:00 in New York
    assert [boundary.at for boundary in found] == [CLOSES, thursday_six]
    assert [boundary.changes for boundary in found] == [
        ["pool h100-inference floor 8 → 4 GPUs"],
        ["pool h100-inference floor 4 → 8 GPUs"],
    ]
    assert set_schedule(h100).next_boundary(NOON) == CLOSES
    assert AppliedPolicy.objects.get(capacity_set=h100).next_boundary == CLOSES
