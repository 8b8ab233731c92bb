"""Applying a set's schedule: what is in force is written at each boundary, once, audited, and
bumps the set's generation; writes that would clash are refused whole."""

from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError

from gpucap.audit.models import AuditEvent
from gpucap.fleet.models import CapacitySet, Pool
from gpucap.schedules import services
from gpucap.schedules.models import PolicyOverride, ScheduleEntry
from gpucap.schedules.selectors import set_schedule

# Wednesday 2 December 2026, 12:00 UTC = 07:00 in New York.
NOON = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
DAY_SHIFT = {
    "name": "day-shift",
    "days": "mon-fri",
    "start": "08:00",
    "end": "20:00",
    "time_zone": "America/New_York",
    "pools": {"h100-inference": {"floor_gpus": 8}},
    "rank_order": ["h100-spot", "h100-ondemand"],
}


def _generation(capacity_set) -> int:
    return CapacitySet.objects.get(pk=capacity_set.pk).generation


@pytest.mark.django_db
def test_a_window_opening_puts_its_values_in_force_once_and_audits_them(fleet_east, operator):
    h100 = fleet_east["sets"]["h100-east"]
    services.schedule_entry_save(capacity_set=h100, data=DAY_SHIFT, actor=operator, now=NOON)
    inference = Pool.objects.get(name="h100-inference")
    assert inference.floor_in_force == 4  # 07:00 in New York: not open yet
    before = _generation(h100)

    opened = NOON + timedelta(hours=1)  # 08:00 in New York
    words = services.policy_apply(capacity_set=h100, now=opened)

    assert "pool h100-inference floor 4 → 8 GPUs" in words
    assert (
        "rank order h100-inference > h100-ondemand > h100-spot → "
        "h100-inference > h100-spot > h100-ondemand"
    ) in words
    inference.refresh_from_db()
    spot = Pool.objects.get(name="h100-spot")
    assert (inference.floor_in_force, inference.floor_gpus) == (8, 4)
    assert (spot.rank_in_force, spot.rank) == (2, 3)
    assert _generation(h100) == before + 1
    assert AuditEvent.objects.filter(verb="policy.apply").count() == 1
    assert services.policy_apply(capacity_set=h100, now=opened) == []  # idempotent
    assert _generation(h100) == before + 1

    closed = NOON + timedelta(hours=13)  # 20:00 in New York
    assert "pool h100-inference floor 8 → 4 GPUs" in services.policy_apply(
        capacity_set=h100, now=closed
    )
    inference.refresh_from_db()
    assert inference.scheduled_floor_gpus is None


@pytest.mark.django_db
def test_the_audit_says_a_change_in_the_words_of_the_timeline(fleet_east, operator):
    """One source of the words of a change (`calendar.Policy.differences`): what the audit log
    records at a boundary is what the timeline and the policy API said it would be."""
    h100 = fleet_east["sets"]["h100-east"]
    services.schedule_entry_save(capacity_set=h100, data=DAY_SHIFT, actor=operator, now=NOON)
    schedule = set_schedule(h100)
    opened, closed = NOON + timedelta(hours=1), NOON + timedelta(hours=13)
    said = schedule.policy_at(NOON).differences(schedule.policy_at(opened))
    said_back = schedule.policy_at(opened).differences(schedule.policy_at(closed))

    assert services.policy_apply(capacity_set=h100, now=opened) == said
    assert services.policy_apply(capacity_set=h100, now=closed) == said_back
    audited = AuditEvent.objects.filter(verb="policy.apply").order_by("pk")
    assert [event.after["changes"] for event in audited] == [said, said_back]
    assert audited[0].message == "; ".join(said)


@pytest.mark.django_db
def test_saving_an_entry_reads_the_schedule_once_whatever_it_holds(
    fleet_east, operator, django_assert_num_queries
):
    """The conflict check, the row replaced and the apply share one read of the schedule."""
    h100 = fleet_east["sets"]["h100-east"]
    night = {**DAY_SHIFT, "name": "night", "start": "22:00", "end": "06:00"}
    night.pop("rank_order")
    services.schedule_entry_save(capacity_set=h100, data=night, actor=operator, now=NOON)

    for queries in (25, 26):  # created, then replaced
        with django_assert_num_queries(queries) as captured:
            services.schedule_entry_save(
                capacity_set=h100, data=DAY_SHIFT, actor=operator, now=NOON
            )
        reads = [
            query["sql"]
            for query in captured.captured_queries
            if query["sql"].startswith('SELECT "schedules_scheduleentry"')
        ]
        assert len(reads) == 1
    assert ScheduleEntry.objects.count() == 2


@pytest.mark.django_db
def test_two_entries_setting_one_floor_at_once_are_refused_naming_both(fleet_east, operator):
    h100 = fleet_east["sets"]["h100-east"]
    services.schedule_entry_save(capacity_set=h100, data=DAY_SHIFT, actor=operator, now=NOON)
    lunch = {
        "name": "lunch",
        "days": ["wed"],
        "start": "11:00",
        "end": "13:00",
        "time_zone": "Europe/London",
        "pools": {"h100-inference": {"floor_gpus": 16}},
    }
    with pytest.raises(ValidationError) as refused:
        services.schedule_entry_save(capacity_set=h100, data=lunch, actor=operator, now=NOON)
    message = str(refused.value)
    assert '"day-shift"' in message and '"lunch"' in message
    assert "h100-inference" in message
    assert not ScheduleEntry.objects.filter(name="lunch").exists()


@pytest.mark.django_db
def test_an_override_wins_over_the_schedule_and_expires_by_itself(fleet_east, operator):
    h100 = fleet_east["sets"]["h100-east"]
    opened = NOON + timedelta(hours=2)
    services.schedule_entry_save(capacity_set=h100, data=DAY_SHIFT, actor=operator, now=opened)
    services.policy_override_set(
        capacity_set=h100,
        data={"name": "peak", "pools": {"h100-inference": {"floor_gpus": 12}}, "ttl_seconds": 60},
        actor=operator,
        now=opened,
    )
    inference = Pool.objects.get(name="h100-inference")
    assert inference.floor_in_force == 12

    services.policy_apply(capacity_set=h100, now=opened + timedelta(seconds=61))

    inference.refresh_from_db()
    assert inference.floor_in_force == 8  # back to the schedule's
    assert not PolicyOverride.objects.exists()
    assert AuditEvent.objects.filter(verb="policy_override.expire").count() == 1


@pytest.mark.django_db
def test_bad_input_names_each_field_and_writes_nothing(fleet_east, operator):
    h100 = fleet_east["sets"]["h100-east"]
    bad = {
        "name": "Night Shift",
        "days": ["someday"],
        "start": "25:00",
        "end": "06:00",
        "time_zone": "Mars/Olympus",
        "pools": {"nope": {"floor_gpus": 1}, "h100-spot": {"floor_gpus": -1}},
    }
    with pytest.raises(ValidationError) as refused:
        services.schedule_entry_save(capacity_set=h100, data=bad, actor=operator, now=NOON)
    fields = set(refused.value.message_dict)
    assert {"name", "days", "start", "time_zone", "pools.nope"} <= fields
    assert "pools.h100-spot.floor_gpus" in fields
    assert not ScheduleEntry.objects.exists()
