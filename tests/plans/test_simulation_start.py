"""What a simulation starts from carries the set's reservations with their windows, in force
or not, and the stored start gives them back (issue 21 with issue 19's reservations)."""

from datetime import time

import pytest

from gpucap.allocation import services as allocation
from gpucap.plans.simulation import simulation_start, start_from_dict, start_to_dict
from gpucap.schedules.calendar import Window


@pytest.fixture
def reserved(fleet_east, tenant, other_tenant, operator):
    """acme: 8 GPUs always; globex: 8 GPUs on weekday nights."""
    h100 = fleet_east["sets"]["h100-east"]
    made = [
        allocation.reservation_create(
            tenant=tenant,
            capacity_set=h100,
            data={"name": "acme-8", "gpus": 8, "block_gpus": 8, "always": True},
            actor=operator,
        ),
        allocation.reservation_create(
            tenant=other_tenant,
            capacity_set=h100,
            data={
                "name": "globex-nights",
                "gpus": 8,
                "block_gpus": 8,
                "days": "mon-fri",
                "start": "22:00",
                "end": "06:00",
                "time_zone": "Europe/Berlin",
            },
            actor=operator,
        ),
    ]
    return h100, made


@pytest.mark.django_db
def test_the_start_names_every_reservation_oldest_first_with_its_window(reserved):
    h100, (acme, globex) = reserved
    start = simulation_start(h100)
    assert [
        (s.reservation.id, s.reservation.tenant, s.reservation.gpus) for s in start.reservations
    ] == [
        (str(acme.pk), "acme", 8),
        (str(globex.pk), "globex", 8),
    ]
    assert start.reservations[0].window is None
    assert start.reservations[1].window == Window(
        frozenset(range(5)), time(22, 0), time(6, 0), "Europe/Berlin"
    )


@pytest.mark.django_db
def test_the_stored_start_gives_the_reservations_back_and_an_older_one_has_none(reserved):
    h100, _ = reserved
    start = simulation_start(h100)
    assert start_from_dict(start_to_dict(start)) == start
    older = start_to_dict(start)
    del older["reservations"]  # a run stored before reservations were simulated
    assert start_from_dict(older).reservations == ()
