"""Reservations read and previewed (issue #19): what each is now, for the API and the pages
(`reservation_facts`: in force, next change, GPUs held inside, borrowers, and what a claim
would reclaim by the set's latest plan), and the preview of a new one
(`reservation_preview`: the set's snapshot with it in force, planned; nothing is written).
How reservations reach the arbiter and come back onto the VMs: `gpucap.plans.reservation_feed`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from gpucap import arbiter
from gpucap.allocation.models import Reservation
from gpucap.allocation.reservations import describe_when, reservation_check
from gpucap.allocation.selectors import (
    RESERVATION_LOOKAHEAD,
    reservation_in_force,
    reservation_next_change,
    reservation_window,
    reservations_borrowers,
    reservations_held,
)
from gpucap.fleet.models import CapacitySet
from gpucap.plans.models import Plan
from gpucap.plans.reservation_feed import in_force_rows, plan_reports, vm_pk, with_reservations
from gpucap.plans.snapshot import capacity_set_snapshot
from gpucap.rentals.models import VirtualMachine
from gpucap.schedules import calendar
from gpucap.tenancy.models import Tenant


@dataclass(frozen=True)
class ReservationFacts:
    """What a reservation is now, for the API and the pages."""

    when: str
    in_force: bool
    next_change: datetime | None
    held_gpus: int
    kept_gpus: int | None = None  # kept free by the latest plan; None: not planned yet
    borrowed: list[dict] = field(default_factory=list)  # {vm_name, tenant, node, gpus}
    claim_reclaims: list[dict] = field(default_factory=list)  # {vm, vm_name, tenant, pool, ...}


def reservation_facts(
    rows: Iterable[Reservation], *, now: datetime | None = None
) -> dict[int, ReservationFacts]:
    """Each reservation's facts, by id. Four queries, whatever the number of rows (none for
    no row)."""
    rows = list(rows)
    if not rows:
        return {}
    now = now or timezone.now()
    ids = [row.pk for row in rows]
    held, borrowers = reservations_held(ids), reservations_borrowers(ids)
    reports = latest_reports({row.capacity_set_id for row in rows})
    claims = {key: _claim_pks(report) for key, report in reports.items()}
    vms = _claimed_vms(claims.values())
    return {
        row.pk: ReservationFacts(
            when=describe_when(reservation_window(row)),
            in_force=reservation_in_force(row, now),
            next_change=reservation_next_change(row, now),
            held_gpus=held[row.pk],
            kept_gpus=reports.get(str(row.pk), {}).get("kept_gpus"),
            borrowed=[
                {"vm_name": name, "tenant": tenant, "node": node, "gpus": gpus}
                for name, tenant, node, gpus in borrowers[row.pk]
            ],
            claim_reclaims=[vms[vm_id] for vm_id in claims.get(str(row.pk), []) if vm_id in vms],
        )
        for row in rows
    }


def latest_reports(capacity_set_ids: set[int]) -> dict[str, dict]:
    """Each reservation's report in the latest plan of its set (what it kept, who borrowed,
    what its claim would reclaim), by reservation id as the plan's reports name it. One
    query."""
    plans = (
        Plan.objects.filter(capacity_set_id__in=capacity_set_ids)
        .order_by("capacity_set_id", "-created_at", "-pk")
        .distinct("capacity_set_id")
        .values_list("reservations", flat=True)
    )
    return {str(report["id"]): report for reports in plans for report in reports or []}


def _claim_pks(report: dict) -> list[int]:
    return [pk for pk in map(vm_pk, report.get("claim_reclaims", [])) if pk]


def _claimed_vms(claims: Iterable[list[int]]) -> dict[int, dict]:
    wanted = {pk for pks in claims for pk in pks}
    if not wanted:
        return {}
    rows = VirtualMachine.objects.filter(pk__in=wanted).select_related("tenant", "pool", "node")
    return {vm.pk: claim_words(vm) for vm in rows}


def claim_words(vm: VirtualMachine) -> dict:
    return {
        "vm": vm.pk,
        "vm_name": vm.name,
        "tenant": vm.tenant.slug,
        "pool": vm.pool.name,
        "node": vm.node.hostname if vm.node_id else None,
        "gpus": vm.gpu_count,
    }


# --- preview -------------------------------------------------------------------------------------

# The proposed reservation's id in the preview's snapshot (a stored one's is its primary key).
PROPOSED = "proposed"


@dataclass(frozen=True)
class ReservationPreview:
    """What keeping the proposed reservation would do on today's fleet, were it in force now."""

    tenant: str
    capacity_set: int
    name: str
    gpus: int
    block_gpus: int
    when: str
    in_force_now: bool
    next_in_force: datetime | None
    kept_gpus: int
    borrowed: list[dict]  # {vm_name, tenant, node, gpus}: would borrow its kept capacity
    claim_reclaims: list[dict]  # {vm, vm_name, tenant, pool, node, gpus}
    claim_complete: bool
    dry_run: bool = True


def reservation_preview(
    *, tenant: Tenant, capacity_set: CapacitySet, data: Mapping, now: datetime | None = None
) -> ReservationPreview:
    """Check the proposed reservation as ``reservation_create`` would (the same refusals),
    then plan the set with it in force: which VMs would borrow its capacity and get notices
    when the tenant claims it, how much is kept now, and whether a claim would be whole.
    Changes nothing."""
    now = now or timezone.now()
    proposal = reservation_check(tenant=tenant, capacity_set=capacity_set, data=data, now=now)
    snap = capacity_set_snapshot(capacity_set)
    rows = [
        row
        for row in in_force_rows(capacity_set, snap.snapshot)
        if row.tenant_id != tenant.pk  # a tenant has one in force at a time: this one
    ]
    proposed = Reservation(
        tenant=tenant, capacity_set=capacity_set, gpus=proposal.gpus, block_gpus=proposal.block_gpus
    )
    snapshot = with_reservations(
        snap.snapshot, rows, snap.live.holders.values(), proposed=(PROPOSED, proposed)
    )
    result = arbiter.plan(snapshot)
    report = next(r for r in plan_reports(result) if str(r["id"]) == PROPOSED)
    vms = snap.vms
    return ReservationPreview(
        tenant=tenant.slug,
        capacity_set=capacity_set.pk,
        name=proposal.name,
        gpus=proposal.gpus,
        block_gpus=proposal.block_gpus,
        when=describe_when(proposal.window),
        in_force_now=proposal.window is None or proposal.window.active_at(now),
        next_in_force=_next_in_force(proposal.window, now),
        kept_gpus=report["kept_gpus"],
        borrowed=[_borrower(vms[i]) for i in report["borrowed"] if i in vms],
        claim_reclaims=[claim_words(vms[i]) for i in report["claim_reclaims"] if i in vms],
        claim_complete=report["claim_complete"],
    )


def _next_in_force(window: calendar.Window | None, now: datetime) -> datetime | None:
    if window is None or window.active_at(now):
        return now
    found = window.occurrences(now, now + RESERVATION_LOOKAHEAD)
    return found[0][0] if found else None


def _borrower(vm: VirtualMachine) -> dict:
    node = vm.node.hostname if vm.node_id else None
    return {"vm_name": vm.name, "tenant": vm.tenant.slug, "node": node, "gpus": vm.gpu_count}
