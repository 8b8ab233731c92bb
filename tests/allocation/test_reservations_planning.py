"""Reservations on the live fleet, end to end with the simulated driver: the set enforces its
plans, globex's spot VMs fill h100-east, and 16 GPUs in blocks of 8 are kept for acme. The
preview names the spot VMs a claim would reclaim; once created, each plan flags them as
borrowing; acme's 8-GPU request is served by notices to borrowers and lands inside its
reservation."""

from datetime import UTC, datetime

import pytest

from gpucap.allocation import services as allocation
from gpucap.allocation.models import Reservation
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services
from gpucap.plans.models import Plan
from gpucap.plans.reservation_feed import borrowed_flags_write
from gpucap.plans.reservations import reservation_preview
from gpucap.plans.snapshot import capacity_set_snapshot
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from gpucap.usage.models import UsageInterval
from tests.allocation.reservation_fleet import globex_spots_fill
from tests.rentals.vm_helpers import request_vm

State = VirtualMachine.State
RESERVE = {"name": "acme-16", "gpus": 16, "block_gpus": 8, "always": True}


@pytest.fixture
def enforcing(h100, operator):
    return services.capacity_set_set_mode(capacity_set=h100, mode="enforce", actor=operator)


@pytest.fixture
def globex_spots(fleet_east, tenant, other_tenant, enforcing) -> list[VirtualMachine]:
    """globex's four running 4-GPU spot VMs filling both nodes; acme may rent on-demand."""
    return globex_spots_fill(fleet_east, tenant, other_tenant, ips="10.64.0")


def _borrowing(reservation) -> set[str]:
    return set(
        VirtualMachine.objects.filter(borrowed_from=reservation).values_list("name", flat=True)
    )


def test_the_preview_names_the_spot_vms_a_claim_would_reclaim_and_changes_nothing(
    h100, tenant, globex_spots, operator_api
):
    h100.refresh_from_db()
    before = (h100.generation, Plan.objects.count(), InterruptionNotice.objects.count())
    body = {"tenant": "acme", "capacity_set": h100.pk, **RESERVE}
    response = operator_api.post("/api/reservations/", body, format="json")
    assert response.status_code == 200, response.json()
    preview = response.json()
    assert preview["dry_run"] is True and preview["in_force_now"] is True
    assert {vm["vm_name"] for vm in preview["claim_reclaims"]} == {
        f"batch-{n}" for n in range(1, 5)
    }
    assert {vm["tenant"] for vm in preview["claim_reclaims"]} == {"globex"}
    # Nothing is free to keep: globex's spot VMs would borrow all 16 GPUs.
    assert preview["claim_complete"] is True and preview["kept_gpus"] == 0
    assert {vm["vm_name"] for vm in preview["borrowed"]} == {f"batch-{n}" for n in range(1, 5)}
    h100.refresh_from_db()
    assert not Reservation.objects.exists()
    after = (h100.generation, Plan.objects.count(), InterruptionNotice.objects.count())
    assert after == before
    assert not VirtualMachine.objects.filter(borrowed_from__isnull=False).exists()


def test_a_windowed_preview_says_when_it_is_next_in_force(h100, tenant, globex_spots):
    saturday = {"days": "sat", "start": "00:00", "end": "00:00", "time_zone": "UTC"}
    monday = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
    preview = reservation_preview(
        tenant=tenant,
        capacity_set=h100,
        data={"name": "weekend", "gpus": 8, "block_gpus": 8, **saturday},
        now=monday,
    )
    assert preview.in_force_now is False
    assert preview.next_in_force == datetime(2026, 12, 12, 0, 0, tzinfo=UTC)
    assert preview.when == "Sat 00:00-00:00 UTC"


def test_acme_claims_its_reservation_from_globex_s_borrowing_spot_vms(
    h100, tenant, fleet_east, globex_spots, operator, operator_api
):
    reservation = allocation.reservation_create(
        tenant=tenant, capacity_set=h100, data=RESERVE, actor=operator
    )
    services.capacity_set_tick(capacity_set_id=h100.pk)
    assert _borrowing(reservation) == {f"batch-{n}" for n in range(1, 5)}
    # From the plan that flags them on, their GPU time is priced as borrowed.
    open_intervals = UsageInterval.objects.filter(vm__in=globex_spots, ended_at__isnull=True)
    assert (
        list(open_intervals.values_list("allocation", "borrowed_from"))
        == [("borrowed", f"reservation-{reservation.pk}")] * 4
    )
    [row] = operator_api.get("/api/reservations/").json()["results"]
    assert (row["borrowed_vms"], row["borrowed_gpus"], row["claim_reclaim_count"]) == (4, 16, 4)

    train = request_vm(tenant, fleet_east["pools"]["h100-ondemand"], name="train-1", gpu_count=8)
    plan = services.capacity_set_tick(capacity_set_id=h100.pk).plan
    assert plan.status == Plan.Status.APPLIED
    notices = list(InterruptionNotice.objects.filter(plan=plan).select_related("vm"))
    victims = [notice.vm for notice in notices]
    assert len(victims) == 2 and {vm.tenant.slug for vm in victims} == {"globex"}
    shown = operator_api.get(f"/api/plans/{plan.pk}/").json()
    [report] = shown["reservations"]
    assert (report["id"], report["tenant"], report["held_after"]) == (
        str(reservation.pk),
        "acme",
        8,
    )
    [placed] = [line for line in shown["actions"] if line["kind"] == "placement"]
    assert (placed["instance_id"], placed["reservation"]) == (train.instance_id, reservation.pk)
    assert {vm.node_id for vm in victims} == {victims[0].node_id}  # one whole node

    for victim in victims:  # the notices run out and the driver reports the victims off
        stopping = rentals.vm_stop_for_notice(vm=victim, message="arbiter notice deadline reached")
        rentals.vm_mark_stopped(vm=stopping)
    services.placements_complete(capacity_set=h100)
    train.refresh_from_db()
    assert train.state == State.PROVISIONING and train.node_id == victims[0].node_id
    assert train.reservation_id == reservation.pk and train.borrowed_from_id is None
    # The arbiter sees it placed inside the reservation: held there first (rule 4).
    inside = {vm.id: vm.reservation for vm in capacity_set_snapshot(h100).snapshot.vms}
    assert inside[train.instance_id] == str(reservation.pk)
    assert {inside[vm.instance_id] for vm in globex_spots if vm.instance_id in inside} <= {None}


def test_a_plan_made_again_flags_nothing_twice(h100, tenant, globex_spots, operator):
    reservation = allocation.reservation_create(
        tenant=tenant, capacity_set=h100, data=RESERVE, actor=operator
    )
    plan = services.capacity_set_tick(capacity_set_id=h100.pk).plan
    flagged = _borrowing(reservation)
    assert len(flagged) == 4
    assert borrowed_flags_write(h100, plan.reservations) == 0  # a retry changes no row
    services.plan_make(capacity_set=h100)
    assert _borrowing(reservation) == flagged


def test_removing_the_reservation_clears_what_borrowed_from_it(
    h100, tenant, globex_spots, operator
):
    reservation = allocation.reservation_create(
        tenant=tenant, capacity_set=h100, data=RESERVE, actor=operator
    )
    services.capacity_set_tick(capacity_set_id=h100.pk)
    assert len(_borrowing(reservation)) == 4
    allocation.reservation_delete(reservation=reservation, actor=operator)
    assert not VirtualMachine.objects.filter(borrowed_from__isnull=False).exists()
    services.capacity_set_tick(capacity_set_id=h100.pk)
    assert not VirtualMachine.objects.filter(borrowed_from__isnull=False).exists()
