"""Reservations in the fleet file (its top-level ``reservations:``): applied through the
reservation services, refused naming the place and field, removed when a given list leaves
them out, and exported so that the export applies to the same reservations."""

import pytest

from gpucap.allocation.models import Reservation
from gpucap.audit.models import AuditEvent
from tests.allocation.test_fleetfile import FLEET, apply, export, refused

RESERVATIONS = """\
reservations:
  - {tenant: acme, capacity_set: h100-east, name: acme-8, gpus: 8, block_gpus: 8, always: true}
  - tenant: acme
    capacity_set: h100-east
    name: nights
    gpus: 16
    block_gpus: 8
    days: mon-fri
    start: "20:00"
    end: "08:00"
    time_zone: UTC
"""


def fleet(reservations: str = RESERVATIONS) -> str:
    return FLEET.replace("QUOTAS\n", reservations)


def rows() -> list[tuple]:
    return list(
        Reservation.objects.order_by("name").values_list("tenant__slug", "name", "gpus", "always")
    )


@pytest.fixture
def fleet_file(tmp_path):
    def write(text: str, name: str = "fleet.yaml"):
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


@pytest.mark.django_db
def test_the_files_reservations_are_applied_once_and_refused_when_they_overlap(fleet_file):
    text = refused(fleet_file(fleet()))
    assert "always" in text and "acme has reservation 'acme-8'" in text
    assert rows() == []
    one = "\n".join(RESERVATIONS.splitlines()[:2]) + "\n"  # acme-8 alone
    output = apply(fleet_file(fleet(one)))
    assert "create reservation acme's acme-8 in h100-east" in output
    assert rows() == [("acme", "acme-8", 8, True)]
    events = AuditEvent.objects.count()
    assert apply(fleet_file(fleet(one))).strip().startswith("nothing to change")
    assert AuditEvent.objects.count() == events
    exported = export()
    assert "reservations:\n  - {tenant: acme, capacity_set: h100-east, name: acme-8" in exported
    apply(fleet_file(fleet("reservations: []\n")))
    assert rows() == []


@pytest.mark.django_db
def test_bad_reservations_are_named_with_their_place(fleet_file):
    bad = (
        "reservations:\n  - {tenant: acme, capacity_set: h100-east, name: x, gpus: 12, "
        "block_gpus: 8, always: true}\n"
    )
    text = refused(fleet_file(fleet(bad)))
    assert "reservations[0]" in text and "gpus: must be whole blocks of 8 GPUs" in text
    assert rows() == []
