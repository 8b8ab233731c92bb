"""/api/reservations/: operators keep GPUs of a set for a tenant (previewed first, then
created), change and remove them; a tenant member reads its own tenant's, with borrowers and
claims counted, never named. Bad input is a 400 naming the field that changes nothing."""

import pytest

from gpucap.allocation import services as allocation
from gpucap.allocation.models import Reservation
from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import running_vm


@pytest.fixture
def h100(fleet_east):
    return fleet_east["sets"]["h100-east"]


@pytest.fixture
def acme_reservation(h100, tenant, operator):
    return allocation.reservation_create(
        tenant=tenant,
        capacity_set=h100,
        data={"name": "acme-8", "gpus": 8, "block_gpus": 8, "always": True},
        actor=operator,
    )


@pytest.fixture
def globex_borrower(fleet_east, other_tenant, acme_reservation):
    """globex's spot VM flagged as borrowing acme's kept capacity."""
    pools = fleet_east["pools"]
    fleet.pool_set_tenants(pool=pools["h100-spot"], tenants=[other_tenant])
    vm = running_vm(
        other_tenant,
        pools["h100-spot"],
        fleet_east["nodes"]["h100-001"],
        [0, 1, 2, 3],
        name="globex-batch",
        ip="10.63.1.1",
    )
    VirtualMachine.objects.filter(pk=vm.pk).update(borrowed_from=acme_reservation)
    return vm


def _fields(response) -> dict:
    return response.json()["error"]["fields"]


def test_an_operator_creates_a_reservation_with_dry_run_false(operator_api, h100):
    body = {
        "tenant": "acme",
        "capacity_set": h100.pk,
        "name": "acme-day",
        "gpus": 16,
        "block_gpus": 8,
        "days": "mon-fri",
        "start": "08:00",
        "end": "20:00",
        "time_zone": "UTC",
        "dry_run": False,
    }
    response = operator_api.post("/api/reservations/", body, format="json")
    assert response.status_code == 201, response.json()
    made = response.json()
    assert (made["tenant"], made["capacity_set_name"], made["gpus"]) == ("acme", "h100-east", 16)
    assert made["when"] == "Mon-Fri 08:00-20:00 UTC" and made["next_change"] is not None
    assert (made["days"], made["start"], made["end"]) == ([0, 1, 2, 3, 4], "08:00", "20:00")
    assert AuditEvent.objects.filter(verb="reservation.create").count() == 1


def test_an_operator_sees_borrowers_by_name(operator_api, globex_borrower, acme_reservation):
    [row] = operator_api.get("/api/reservations/").json()["results"]
    assert (row["name"], row["in_force"], row["next_change"]) == ("acme-8", True, None)
    assert row["borrowed"] == [
        {"vm_name": "globex-batch", "tenant": "globex", "node": "h100-001", "gpus": 4}
    ]
    assert (row["borrowed_vms"], row["borrowed_gpus"], row["held_gpus"]) == (1, 4, 0)


def test_a_member_reads_its_own_with_borrowers_counted_not_named(
    member_api, other_member_api, globex_borrower, acme_reservation
):
    [row] = member_api.get("/api/reservations/").json()["results"]
    assert (row["borrowed_vms"], row["borrowed_gpus"], row["borrowed"]) == (1, 4, [])
    assert "globex-batch" not in str(row)
    assert other_member_api.get("/api/reservations/").json()["results"] == []
    url = f"/api/reservations/{acme_reservation.pk}/"
    assert other_member_api.get(url).status_code == 404
    assert member_api.get(url).status_code == 200
    assert member_api.delete(url).status_code == 403
    assert member_api.patch(url, {"gpus": 16}, format="json").status_code == 403
    assert Reservation.objects.get().gpus == 8


def test_the_list_filters_and_counts_its_queries(
    operator_api, acme_reservation, globex_borrower, h100, tenant, django_assert_num_queries
):
    with django_assert_num_queries(6):
        rows = operator_api.get(f"/api/reservations/?tenant={tenant.pk}").json()["results"]
    assert [row["name"] for row in rows] == ["acme-8"]
    assert operator_api.get("/api/reservations/?capacity_set=999").json()["results"] == []
    assert operator_api.get("/api/reservations/?tenant=").status_code == 400


def test_a_set_lists_its_reservations(
    operator_api, member_api, other_member_api, h100, acme_reservation
):
    url = f"/api/capacity-sets/{h100.pk}/reservations/"
    assert [row["name"] for row in operator_api.get(url).json()] == ["acme-8"]
    assert member_api.get(url).status_code == 403  # the set's routes are the operators'
    assert other_member_api.get(url).status_code == 403
    assert operator_api.get("/api/capacity-sets/999999/reservations/").status_code == 404


def test_an_operator_changes_and_removes_one(operator_api, acme_reservation):
    url = f"/api/reservations/{acme_reservation.pk}/"
    response = operator_api.patch(url, {"gpus": 16}, format="json")
    assert response.status_code == 200 and response.json()["gpus"] == 16
    refused = operator_api.patch(url, {"gpus": 12}, format="json")
    assert refused.status_code == 400 and "multiple of 8" in _fields(refused)["gpus"][0]
    assert Reservation.objects.get().gpus == 16
    assert operator_api.delete(url).status_code == 204
    assert not Reservation.objects.exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"gpus": 24}, "gpus"),
        ({"gpus": 12}, "gpus"),
        ({"block_gpus": 3}, "block_gpus"),
        ({"gpus": "16"}, "gpus"),
        ({"tenant": "nobody"}, "tenant"),
        ({"capacity_set": 999999}, "capacity_set"),
        ({"days": "someday", "start": "08:00", "end": "20:00", "time_zone": "UTC"}, "days"),
        ({"days": "mon", "start": "08:00", "end": "20:00", "time_zone": "Mars/Base"}, "time_zone"),
        ({"colour": "red"}, "colour"),
    ],
)
@pytest.mark.parametrize("dry_run", [True, False])
def test_bad_input_is_a_400_naming_the_field_and_changes_nothing(
    operator_api, h100, body, field, dry_run
):
    body = {
        "tenant": "acme",
        "capacity_set": h100.pk,
        "name": "acme-16",
        "gpus": 16,
        "block_gpus": 8,
        "always": True,
        "dry_run": dry_run,
        **body,
    }
    if "days" in body:
        body.pop("always")
    h100.refresh_from_db()
    generation = h100.generation
    response = operator_api.post("/api/reservations/", body, format="json")
    assert response.status_code == 400, response.json()
    assert field in _fields(response)
    assert not Reservation.objects.exists()
    h100.refresh_from_db()
    assert h100.generation == generation


def test_members_cannot_create(member_api, h100):
    body = {"tenant": "acme", "capacity_set": h100.pk, "name": "x", "gpus": 8, "block_gpus": 8}
    assert member_api.post("/api/reservations/", body, format="json").status_code == 403
