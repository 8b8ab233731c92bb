"""Reservations' services: each bad input refused naming the field with nothing changed, the
windows in force and their boundaries, the audit and the set planned again."""

from datetime import UTC, datetime, time

import pytest
from django.core.exceptions import ValidationError

from gpucap.allocation import services as allocation
from gpucap.allocation.models import Reservation
from gpucap.allocation.selectors import (
    reservation_next_change,
    reservations_in_force,
    set_reservable_gpus,
)
from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import running_vm

# A Monday, 10:00 UTC.
MONDAY = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
DAY_SHIFT = {"days": "mon-fri", "start": "08:00", "end": "20:00", "time_zone": "UTC"}


def _state() -> tuple:
    return (
        dict(CapacitySet.objects.values_list("name", "generation")),
        AuditEvent.objects.count(),
        list(Reservation.objects.values_list("name", "gpus", "days", "always")),
    )


@pytest.fixture
def reserve(fleet_east, tenant, operator):
    """``reserve(tenant=acme, name="acme-16", gpus=16, block_gpus=8, always=True, **data)``."""

    def make(who=None, capacity_set="h100-east", **data):
        data = {"name": "acme-16", "gpus": 16, "block_gpus": 8, **data}
        if not any(key in data for key in ("days", "start", "end", "time_zone")):
            data.setdefault("always", True)
        return allocation.reservation_create(
            tenant=who or tenant,
            capacity_set=fleet_east["sets"][capacity_set],
            data=data,
            actor=operator,
            now=MONDAY,
        )

    return make


@pytest.mark.parametrize(
    "given, field, words",
    [
        ({"gpus": 0}, "gpus", "1 or more"),
        ({"gpus": "16"}, "gpus", "whole number"),
        ({"gpus": 12}, "gpus", "12 is not a multiple of 8"),
        ({"block_gpus": 3}, "block_gpus", "1, 2, 4 or 8"),
        ({"gpus": 24}, "gpus", "24 GPUs is more than capacity set h100-east has: 16 GPUs"),
        ({"name": "Not A Slug"}, "name", "lowercase"),
        ({"always": True, "days": "mon"}, "always", "leave out days"),
        ({"always": False}, "always", "give a weekly window"),
        ({**DAY_SHIFT, "time_zone": "Mars/Olympus"}, "time_zone", "not an IANA time zone"),
        ({**DAY_SHIFT, "days": "someday"}, "days", "is not a day"),
        ({**DAY_SHIFT, "start": "25:00"}, "start", "HH:MM"),
        ({"colour": "red"}, "colour", "not a field"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_changes_nothing(reserve, given, field, words):
    before = _state()
    with pytest.raises(ValidationError) as refused:
        reserve(**given)
    assert words in refused.value.message_dict[field][0]
    assert _state() == before


def test_a_pcie_set_keeps_only_single_cards(reserve):
    with pytest.raises(ValidationError) as refused:
        reserve(capacity_set="l40s-east", gpus=4, block_gpus=2)
    assert (
        "its pcie fabric allocates partitions of 1 GPU"
        in (refused.value.message_dict["block_gpus"][0])
    )
    assert reserve(capacity_set="l40s-east", gpus=4, block_gpus=1).gpus == 4


def test_the_set_counts_ready_nodes_not_dedicated(reserve, fleet_east, other_tenant, operator):
    h100 = fleet_east["sets"]["h100-east"]
    assert set_reservable_gpus(h100) == 16
    fleet.node_set_dedicated_tenant(
        node=fleet_east["nodes"]["h100-002"], tenant=other_tenant, actor=operator
    )
    assert set_reservable_gpus(h100) == 8
    with pytest.raises(ValidationError) as refused:
        reserve()
    assert "on ready nodes not dedicated" in refused.value.message_dict["gpus"][0]


def test_a_tenant_has_one_reservation_in_force_in_a_set_at_a_time(reserve):
    reserve(name="day", gpus=8, **DAY_SHIFT)
    before = _state()
    with pytest.raises(ValidationError) as refused:
        reserve(name="always", gpus=8, always=True)
    assert "acme has reservation 'day'" in refused.value.message_dict["always"][0]
    with pytest.raises(ValidationError) as refused:
        reserve(name="evening", gpus=8, days="fri", start="18:00", end="23:00", time_zone="UTC")
    words = refused.value.message_dict["days"][0]
    assert "Mon-Fri 08:00-20:00 UTC" in words and "from Fri 2026-12-11 18:00 UTC" in words
    assert _state() == before
    night = reserve(
        name="night", gpus=8, days="mon-fri", start="20:00", end="08:00", time_zone="UTC"
    )
    assert night.end_time == time(8, 0)


def test_tenants_together_cannot_keep_more_than_the_set(reserve, other_tenant):
    reserve(name="acme-day", gpus=8, **DAY_SHIFT)
    before = _state()
    with pytest.raises(ValidationError) as refused:
        reserve(other_tenant, name="globex-all", gpus=16)
    words = refused.value.message_dict["gpus"][0]
    assert "acme-day (acme, 8)" in words and "would keep 24 GPUs; it has 16" in words
    assert _state() == before
    # At weekends acme's is not in force: a weekend reservation of the whole set fits.
    weekend = {"days": "sat, sun", "start": "00:00", "end": "00:00", "time_zone": "UTC"}
    assert reserve(other_tenant, name="globex-weekend", gpus=16, **weekend).gpus == 16


def test_creating_audits_and_plans_the_set_again(reserve, fleet_east):
    before = fleet_east["sets"]["h100-east"].generation
    made = reserve()
    assert CapacitySet.objects.get(name="h100-east").generation > before
    event = AuditEvent.objects.get(verb="reservation.create")
    assert event.after["gpus"] == 16 and event.after["always"] is True
    assert str(made) == "h100-east/acme-16"


def test_windows_in_force_and_their_next_change(reserve, fleet_east):
    day = reserve(name="day", gpus=8, **DAY_SHIFT)
    h100 = fleet_east["sets"]["h100-east"]
    assert [r.name for r in reservations_in_force(h100, MONDAY)] == ["day"]
    assert reservation_next_change(day, MONDAY) == datetime(2026, 12, 7, 20, 0, tzinfo=UTC)
    evening = datetime(2026, 12, 7, 21, 0, tzinfo=UTC)
    assert reservations_in_force(h100, evening) == []
    assert reservation_next_change(day, evening) == datetime(2026, 12, 8, 8, 0, tzinfo=UTC)
    friday_night = datetime(2026, 12, 11, 21, 0, tzinfo=UTC)
    assert reservation_next_change(day, friday_night) == datetime(2026, 12, 14, 8, 0, tzinfo=UTC)


def test_an_always_reservation_never_changes(reserve, fleet_east):
    made = reserve()
    assert reservation_next_change(made, MONDAY) is None
    assert reservations_in_force(fleet_east["sets"]["h100-east"], MONDAY) == [made]


def test_updating_checks_the_whole_and_switches_between_always_and_a_window(reserve, operator):
    made = reserve()
    with pytest.raises(ValidationError) as refused:
        allocation.reservation_update(reservation=made, data={"gpus": 10}, actor=operator)
    assert "multiple of 8" in refused.value.message_dict["gpus"][0]
    changed = allocation.reservation_update(
        reservation=made, data=DAY_SHIFT, actor=operator, now=MONDAY
    )
    assert (changed.always, changed.days, changed.time_zone) == (False, [0, 1, 2, 3, 4], "UTC")
    back = allocation.reservation_update(
        reservation=changed, data={"always": True, "gpus": 8}, actor=operator, now=MONDAY
    )
    assert (back.always, back.days, back.start_time, back.gpus) == (True, [], None, 8)
    assert AuditEvent.objects.filter(verb="reservation.update").count() == 2


def test_a_boundary_clears_what_borrowed_from_an_ended_reservation(
    reserve, fleet_east, other_tenant
):
    day = reserve(name="day", gpus=8, **DAY_SHIFT)
    pools, nodes = fleet_east["pools"], fleet_east["nodes"]
    fleet.pool_set_tenants(pool=pools["h100-spot"], tenants=[other_tenant])
    spot = running_vm(
        other_tenant, pools["h100-spot"], nodes["h100-001"], [0], name="s-1", ip="10.50.0.9"
    )
    VirtualMachine.objects.filter(pk=spot.pk).update(borrowed_from=day)
    h100 = fleet_east["sets"]["h100-east"]
    assert allocation.reservations_boundary(capacity_set_id=h100.pk, now=MONDAY) == 0
    evening = datetime(2026, 12, 7, 21, 0, tzinfo=UTC)
    generation = CapacitySet.objects.get(pk=h100.pk).generation
    assert allocation.reservations_boundary(capacity_set_id=h100.pk, now=evening) == 1
    assert VirtualMachine.objects.get(pk=spot.pk).borrowed_from is None
    assert CapacitySet.objects.get(pk=h100.pk).generation == generation + 1


def test_deleting_keeps_the_vms_and_is_harmless_twice(reserve, fleet_east, tenant, operator):
    made = reserve()
    pools, nodes = fleet_east["pools"], fleet_east["nodes"]
    vm = running_vm(tenant, pools["h100-spot"], nodes["h100-001"], [0], name="a-1", ip="10.50.0.8")
    VirtualMachine.objects.filter(pk=vm.pk).update(reservation=made)
    allocation.reservation_delete(reservation=made, actor=operator)
    allocation.reservation_delete(reservation=made, actor=operator)
    assert VirtualMachine.objects.get(pk=vm.pk).reservation is None
    assert AuditEvent.objects.filter(verb="reservation.delete").count() == 1


def test_a_window_asks_for_the_set_to_be_planned_again_at_its_next_boundary(
    reserve, fleet_east, monkeypatch
):
    from gpucap.allocation import reservations

    sent = []
    monkeypatch.setattr(reservations, "wake_at", lambda *args: sent.append(args))
    reserve(name="day", gpus=8, **DAY_SHIFT)
    h100 = fleet_east["sets"]["h100-east"]
    evening = datetime(2026, 12, 7, 20, 0, tzinfo=UTC)
    assert sent == [("allocation.reservation_boundary", h100.pk, evening)]
    allocation.reservations_boundary(capacity_set_id=h100.pk, now=evening)
    assert sent[-1] == ("allocation.reservation_boundary", h100.pk, evening.replace(day=8, hour=8))
