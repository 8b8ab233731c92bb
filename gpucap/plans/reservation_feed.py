"""Reservations between the live fleet and the arbiter (issue #19): what a set's snapshot
carries, and what a plan writes back onto the VMs.

- `with_reservations`: the snapshot gets the set's reservations in force at its ``now``
  (``{"id": the row's primary key as text, "tenant", "gpus", "block_gpus"}``) and each VM
  borrowing from one of them its ``"borrowed"`` id. A set with none is handed on untouched.
- `borrowed_flags_write`, after each plan: the VMs a report lists as borrowing get
  ``borrowed_from``, the set's VMs no longer listed lose it (one UPDATE per reservation and one
  for the rest, each touching only rows that differ: a plan made twice changes nothing more).
  A reservation that ended has no report, so its borrowers are cleared by the next plan (and
  at once by the boundary, ``allocation.reservations_boundary``).
- `placement_flags_copy`, when a placement is carried out: the VM gets the placement's
  ``reservation`` / ``borrowed`` (or loses a stale one).
- `plan_reports`: the reports as the plan stores them (``Plan.reservations``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from django.utils import timezone

from gpucap.allocation.models import Reservation
from gpucap.allocation.selectors import reservations_in_force
from gpucap.arbiter import model as am
from gpucap.fleet.models import CapacitySet
from gpucap.rentals.models import VirtualMachine
from gpucap.rentals.services import HOLDING
from gpucap.usage.services import usage_reattribute

REPORT_FIELDS = (
    "id",
    "tenant",
    "gpus",
    "block_gpus",
    "held_before",
    "held_after",
    "kept_gpus",
    "borrowed",
    "claim_reclaims",
    "claim_complete",
    "short_gpus",
)


def in_force_rows(capacity_set: CapacitySet, snapshot: am.Snapshot) -> list[Reservation]:
    """The set's reservations in force at the snapshot's ``now`` (one query), oldest first."""
    return reservations_in_force(capacity_set, snapshot.now, order_by="pk")


def with_reservations(
    snapshot: am.Snapshot,
    rows: Iterable[Reservation],
    borrowed: dict[str, int],
    *,
    proposed: tuple[str, Reservation] | None = None,
) -> am.Snapshot:
    """``snapshot`` with ``rows`` in force and the VMs of ``borrowed`` (instance id ->
    reservation id) flagged (docs/arbiter.md, "Reservations"). A flag naming a reservation not in
    force is left out (the boundary clears it). ``proposed``: one more, unsaved, under its own
    id (the preview's)."""
    named = [(str(row.pk), row) for row in rows]
    if proposed is not None:
        named.append(proposed)
    if not named:
        return snapshot
    reservations = tuple(
        am.Reservation(id=key, tenant=row.tenant.slug, gpus=row.gpus, block_gpus=row.block_gpus)
        for key, row in named
    )
    ids = {reservation.id for reservation in reservations}
    vms = tuple(
        replace(vm, borrowed=str(borrowed[vm.id]))
        if vm.id in borrowed and str(borrowed[vm.id]) in ids
        else vm
        for vm in snapshot.vms
    )
    return replace(snapshot, reservations=reservations, vms=vms)


def plan_reports(result: am.Plan) -> list[dict]:
    """The plan's reservation reports as stored on the plan (JSON)."""
    return [
        {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in ((key, getattr(report, key)) for key in REPORT_FIELDS)
        }
        for report in result.reservations
    ]


def borrowed_flags_write(capacity_set: CapacitySet, reports: list[dict]) -> int:
    """Flag the VMs each report lists as borrowing that hold GPUs now (a pending VM the plan
    would place borrowing gets its flag from the placement, once placed), and clear the flag
    of the set's VMs no report lists. Returns how many rows changed (0 when the plan was made
    before)."""
    changed = 0
    listed: set[int] = set()
    for report in reports:
        reservation_id = int(report["id"])
        pks = {pk for pk in map(vm_pk, report["borrowed"]) if pk is not None}
        listed |= pks
        changed += (
            VirtualMachine.objects.filter(
                pk__in=pks, pool__capacity_set=capacity_set, state__in=HOLDING
            )
            .exclude(borrowed_from_id=reservation_id)
            .update(borrowed_from_id=reservation_id)
        )
    changed += (
        VirtualMachine.objects.filter(pool__capacity_set=capacity_set, borrowed_from__isnull=False)
        .exclude(pk__in=listed)
        .update(borrowed_from=None)
    )
    if changed:  # the borrowers' GPU time from now on is priced as borrowed, or no longer
        usage_reattribute(
            vm_ids=VirtualMachine.objects.filter(pool__capacity_set=capacity_set).values_list(
                "pk", flat=True
            ),
            now=timezone.now(),
        )
    return changed


def placement_flags_copy(vm: VirtualMachine, action, *, placed_at: datetime) -> None:
    """Give a VM just placed (at ``placed_at``, read before placing it) the placement's
    reservation and borrowed flags (one UPDATE, only when they differ from what the VM has),
    and its usage interval the attribution they give: the interval opened at the placement is
    corrected in place, not split."""
    wanted = (action.reservation_id, action.borrowed_from_id)
    if (vm.reservation_id, vm.borrowed_from_id) == wanted:
        return
    VirtualMachine.objects.filter(pk=vm.pk).update(
        reservation_id=wanted[0], borrowed_from_id=wanted[1]
    )
    vm.reservation_id, vm.borrowed_from_id = wanted
    usage_reattribute(vm_ids=[vm.pk], now=placed_at)


def placement_reservation_ids(placement: am.Placement) -> tuple[int | None, int | None]:
    """(reservation id, borrowed-from id) of a placement, as the plan's line keeps them."""
    return (
        _reservation_pk(placement.reservation),
        _reservation_pk(placement.borrowed),
    )


def _reservation_pk(value: object) -> int | None:
    return int(value) if isinstance(value, str) and value.isdigit() else None


def vm_pk(instance_id: object) -> int | None:
    """42 for ``vm-42`` (a VM's instance id, as snapshots name VMs); None for anything else."""
    if isinstance(instance_id, str) and instance_id.startswith("vm-"):
        digits = instance_id.removeprefix("vm-")
        return int(digits) if digits.isdigit() else None
    return None
