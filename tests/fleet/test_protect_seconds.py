"""A pool's protection window, ``protect_seconds`` (#17 build 2): set through the pools API and
the fleet file, strict about its value, exported, audited, and a change plans the set again."""

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet, Pool
from tests.fleet import test_fleetfile as fleetfile_tests
from tests.fleet.test_api import error_fields, fleet_state, generation, pool_body
from tests.fleet.test_fleetfile import FLEET, apply, edited, export, refused, rows

# The fleet file fixtures.
fleet_file = fleetfile_tests.fleet_file
fast_passwords = fleetfile_tests.fast_passwords

SPOT = "{name: h100-spot, kind: spot, cluster: east, capacity_set: h100-east, rank: 3"


def test_a_pool_protects_nothing_by_default(operator_api, fleet_east):
    response = operator_api.post("/api/pools/", pool_body(fleet_east), format="json")
    assert response.status_code == 201 and response.data["protect_seconds"] == 0
    summary = operator_api.get(f"/api/capacity-sets/{fleet_east['sets']['h100-east'].pk}/")
    assert {p["name"]: p["protect_seconds"] for p in summary.data["pools"]}["h100-spot"] == 0


def test_operator_creates_a_pool_with_a_protection_window(operator_api, fleet_east):
    body = pool_body(fleet_east, protect_seconds=600)
    response = operator_api.post("/api/pools/", body, format="json")
    assert response.status_code == 201 and response.data["protect_seconds"] == 600
    assert Pool.objects.get(name="h100-batch").protect_seconds == 600
    event = AuditEvent.objects.get(verb="pool.create", object_id=str(response.data["id"]))
    assert event.after["protect_seconds"] == 600


def test_operator_changes_a_pools_protection_and_the_set_is_planned_again(operator_api, fleet_east):
    pool, h100 = fleet_east["pools"]["h100-spot"], fleet_east["sets"]["h100-east"]
    before = generation(h100)
    response = operator_api.patch(f"/api/pools/{pool.pk}/", {"protect_seconds": 600}, format="json")
    assert response.status_code == 200 and response.data["protect_seconds"] == 600
    assert generation(h100) == before + 1
    event = AuditEvent.objects.get(verb="pool.set_protect")
    assert (event.before, event.after) == ({"protect_seconds": 0}, {"protect_seconds": 600})
    # The same value again changes nothing.
    operator_api.patch(f"/api/pools/{pool.pk}/", {"protect_seconds": 600}, format="json")
    assert generation(h100) == before + 1


BAD_VALUES = [
    (-1, "Ensure this value is greater than or equal to 0."),
    (604801, "Ensure this value is less than or equal to 604800."),
    (1.5, "A valid integer is required."),
    ("600", "must be a whole number"),
    (None, "This field may not be null."),
]


@pytest.mark.parametrize(("value", "reason"), BAD_VALUES)
def test_a_bad_protect_seconds_is_a_400_naming_the_field_on_create(
    operator_api, fleet_east, value, reason
):
    before = fleet_state()
    body = pool_body(fleet_east, protect_seconds=value)
    response = operator_api.post("/api/pools/", body, format="json")
    assert response.status_code == 400
    fields = error_fields(response)
    assert list(fields) == ["protect_seconds"] and reason in fields["protect_seconds"][0]
    assert fleet_state() == before


@pytest.mark.parametrize(("value", "reason"), BAD_VALUES)
def test_a_bad_protect_seconds_is_a_400_naming_the_field_on_update(
    operator_api, fleet_east, value, reason
):
    pool = fleet_east["pools"]["h100-spot"]
    before = fleet_state()
    response = operator_api.patch(
        f"/api/pools/{pool.pk}/", {"protect_seconds": value}, format="json"
    )
    assert response.status_code == 400
    fields = error_fields(response)
    assert list(fields) == ["protect_seconds"] and reason in fields["protect_seconds"][0]
    assert fleet_state() == before


def test_a_member_cannot_change_a_pools_protection(member_api, fleet_east):
    pool = fleet_east["pools"]["h100-spot"]
    response = member_api.patch(f"/api/pools/{pool.pk}/", {"protect_seconds": 60}, format="json")
    assert response.status_code == 403
    assert Pool.objects.get(pk=pool.pk).protect_seconds == 0


@pytest.mark.parametrize("value", [-5, 604801, True, "10"])
def test_the_service_refuses_what_the_api_would(fleet_east, value):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as caught:
        fleet.pool_set_protect(pool=fleet_east["pools"]["h100-spot"], protect_seconds=value)
    assert "protect_seconds" in caught.value.message_dict


# --- the fleet file ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_fleet_file_sets_exports_and_changes_protect_seconds(fleet_file):
    text = edited(FLEET, SPOT, SPOT + ", protect_seconds: 600")
    output = apply(fleet_file(text))
    assert Pool.objects.get(name="h100-spot").protect_seconds == 600
    assert "protects VMs for 600 s" in output
    assert "protect_seconds: 600" in export()
    assert Pool.objects.get(name="h100-ondemand").protect_seconds == 0
    assert "h100-ondemand" in export() and export().count("protect_seconds") == 1
    assert apply(fleet_file(text)).count("update pool") == 0, "a second run changes nothing"

    h100 = CapacitySet.objects.get(name="h100-east")
    changed = edited(FLEET, SPOT, SPOT + ", protect_seconds: 60")
    output = apply(fleet_file(changed))

    assert Pool.objects.get(name="h100-spot").protect_seconds == 60
    assert "update pool h100-spot: protect_seconds 600 -> 60" in output
    assert CapacitySet.objects.get(pk=h100.pk).generation == h100.generation + 1
    event = AuditEvent.objects.get(verb="pool.set_protect")
    assert (event.before, event.after) == ({"protect_seconds": 600}, {"protect_seconds": 60})


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["-1", "604801", "1.5", "ten"])
def test_a_bad_protect_seconds_in_the_fleet_file_is_named(fleet_file, value):
    apply(fleet_file())
    before = rows()
    message = refused(fleet_file(edited(FLEET, SPOT, SPOT + f", protect_seconds: {value}")))
    assert "pools[2] (h100-spot): protect_seconds" in message
    assert rows() == before
