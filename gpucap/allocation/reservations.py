"""Changes to reservations: GPUs of a capacity set kept for a tenant, always or in one weekly
window (docs/allocation.md, "Reservations"). Operators only; ``allocation.services`` is where
callers find them.

Every write is validated whole before anything is written, and a refusal names the field:
a block size the set's fabric does not allocate, GPUs that are not whole blocks or more than
the set has, a window the schedules' reader refuses, a second reservation of the same tenant
in the set at the same time, or reservations of all tenants in force together keeping more
than the set has. Then it is audited and bumps the set's generation, so the set is planned
again with it; each window boundary does so too (`reservations_boundary`, sent for the moment).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from django.apps import apps
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from gpucap.allocation.models import Reservation
from gpucap.allocation.selectors import (
    reservation_in_force,
    reservation_window,
    set_next_reservation_change,
    set_reservable_gpus,
)
from gpucap.arbiter.topology import block_sizes
from gpucap.audit.services import Actor, audit_record
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet
from gpucap.schedules import calendar, spec
from gpucap.tasks import wake_at
from gpucap.tenancy.models import Tenant

FIELDS = ("name", "gpus", "block_gpus", "always", *spec.WINDOW_FIELDS)
BOUNDARY_TASK = "allocation.reservation_boundary"


@dataclass(frozen=True)
class Proposal:
    """A reservation as written, read and checked: what the services save and the preview
    puts in force."""

    name: str
    gpus: int
    block_gpus: int
    window: calendar.Window | None  # None: always in force


@transaction.atomic
def reservation_create(
    *,
    tenant: Tenant,
    capacity_set: CapacitySet,
    data: Mapping,
    actor: Actor = None,
    now: datetime | None = None,
) -> Reservation:
    """Keep ``data["gpus"]`` GPUs of the set for the tenant, in blocks of ``block_gpus``,
    ``always`` or during the window ``days``/``start``/``end``/``time_zone``."""
    now = now or timezone.now()
    fleet.lock_set(capacity_set)
    proposal = reservation_check(tenant=tenant, capacity_set=capacity_set, data=data, now=now)
    row = Reservation(tenant=tenant, capacity_set=capacity_set, created_by=_user(actor))
    _write(row, proposal)
    audit_record(actor=actor, verb="reservation.create", target=row, after=_fields(row))
    _changed(capacity_set, now)
    return row


@transaction.atomic
def reservation_update(
    *, reservation: Reservation, data: Mapping, actor: Actor = None, now: datetime | None = None
) -> Reservation:
    """Change some of the reservation's fields (the others keep their values); switching
    between ``always`` and a window replaces the one with the other."""
    now = now or timezone.now()
    fleet.lock_set(reservation.capacity_set)
    row = Reservation.objects.select_related("tenant", "capacity_set").get(pk=reservation.pk)
    merged = {**written(row), **data}
    if data.get("always") is True:
        merged = {key: value for key, value in merged.items() if key not in written(row)}
        merged = {**merged, **{key: data[key] for key in data}}
        for key in ("name", "gpus", "block_gpus"):
            merged.setdefault(key, getattr(row, key))
    elif any(key in data for key in spec.WINDOW_FIELDS) and "always" not in data:
        merged["always"] = False
    proposal = reservation_check(
        tenant=row.tenant, capacity_set=row.capacity_set, data=merged, now=now, instead_of=row
    )
    before = _fields(row)
    _write(row, proposal)
    if _fields(row) != before:
        audit_record(
            actor=actor, verb="reservation.update", target=row, before=before, after=_fields(row)
        )
        _changed(row.capacity_set, now)
    return row


@transaction.atomic
def reservation_delete(
    *, reservation: Reservation, actor: Actor = None, now: datetime | None = None
) -> None:
    """Remove the reservation: its VMs keep running; what they borrowed is no longer kept."""
    locked = Reservation.objects.select_for_update().filter(pk=reservation.pk).first()
    if locked is None:
        return  # deleted already: harmless the second time
    audit_record(actor=actor, verb="reservation.delete", target=locked, before=_fields(locked))
    capacity_set = locked.capacity_set
    locked.delete()  # the VMs' reservation and borrowed_from are set null
    _changed(capacity_set, now or timezone.now())


@transaction.atomic
def reservations_boundary(*, capacity_set_id: int, now: datetime) -> int:
    """A reservation of the set came into or went out of force: plan the set again, clear
    the flags of reservations no longer in force (their borrowers borrow no more, and the VMs
    placed inside one are no longer inside it: the usage beat prices their GPU time as shared
    from then on), and wait for the next boundary. Returns how many VMs stopped borrowing.
    Harmless twice."""
    rows = list(Reservation.objects.filter(capacity_set_id=capacity_set_id))
    ended = [row.pk for row in rows if not reservation_in_force(row, now)]
    cleared = _vms().objects.filter(borrowed_from_id__in=ended).update(borrowed_from=None)
    _vms().objects.filter(reservation_id__in=ended).update(reservation=None)
    fleet.capacity_set_bump(capacity_set_id=capacity_set_id)
    following = set_next_reservation_change(capacity_set_id, now)
    if following is not None:
        wake_at(BOUNDARY_TASK, capacity_set_id, following)
    return cleared


def reservation_check(
    *,
    tenant: Tenant,
    capacity_set: CapacitySet,
    data: Mapping,
    now: datetime,
    instead_of: Reservation | None = None,
) -> Proposal:
    """The reservation ``data`` describes, checked against the set and its other
    reservations (``instead_of``: the one it replaces); a `ValidationError` by field when
    something is wrong. Changes nothing: the preview calls it too."""
    problems: dict[str, str] = {}
    window = read_reservation(
        data, problems, fabric=capacity_set.fabric, set_name=capacity_set.name
    )
    if problems:
        raise ValidationError(problems)
    name, gpus, block = data["name"], data["gpus"], data["block_gpus"]
    others = list(
        Reservation.objects.filter(capacity_set=capacity_set)
        .exclude(pk=getattr(instead_of, "pk", None))
        .select_related("tenant")
        .order_by("name")
    )
    if any(other.name == name for other in others):
        problems["name"] = f"capacity set {capacity_set.name} has a reservation {name!r} already"
    proposal = Proposal(name=name, gpus=gpus, block_gpus=block, window=window)
    reservable = set_reservable_gpus(capacity_set)
    if gpus > reservable:
        problems["gpus"] = (
            f"{gpus} GPUs is more than capacity set {capacity_set.name} has: {reservable} GPUs "
            "on ready nodes not dedicated to a tenant"
        )
    clash = _same_tenant_clash(tenant, proposal, others, now)
    if clash:
        problems["always" if window is None else "days"] = clash
    if "gpus" not in problems and (crowd := _crowding(proposal, others, reservable, now)):
        problems["gpus"] = crowd
    if problems:
        raise ValidationError(problems)
    return proposal


def read_reservation(
    data: Mapping, problems: dict[str, str], *, fabric: str | None = None, set_name: str = ""
) -> calendar.Window | None:
    """Read a reservation's fields as written (the API's, the fleet file's), adding what is
    wrong by field to ``problems``; its window (None: always). ``fabric``: the set's, when
    known, whose partition sizes the blocks must be."""
    for key in data:
        if key not in FIELDS:
            problems[str(key)] = "is not a field of a reservation"
    if problem := spec.name_problem(data.get("name")):
        problems["name"] = problem
    _sizes(fabric, set_name, data.get("gpus"), data.get("block_gpus"), problems)
    return _window(data, problems)


def written(row: Reservation) -> dict:
    """The reservation's fields as they are written (the API's, the fleet file's)."""
    fields = {"name": row.name, "gpus": row.gpus, "block_gpus": row.block_gpus}
    if row.always:
        return {**fields, "always": True}
    return {
        **fields,
        "always": False,
        "days": list(row.days),
        "start": row.start_time.strftime("%H:%M"),
        "end": row.end_time.strftime("%H:%M"),
        "time_zone": row.time_zone,
    }


def describe_when(window: calendar.Window | None) -> str:
    return "always" if window is None else window.describe()


# --- checks ------------------------------------------------------------------------------------


def _sizes(fabric: str | None, set_name: str, gpus, block, problems: dict[str, str]) -> None:
    allowed = block_sizes(fabric) if fabric else Reservation.BLOCK_SIZES
    if not isinstance(block, int) or isinstance(block, bool) or block not in (1, 2, 4, 8):
        problems["block_gpus"] = f"must be 1, 2, 4 or 8 GPUs (an NVLink partition), got {block!r}"
    elif block not in allowed:
        problems["block_gpus"] = (
            f"blocks of {block} GPUs cannot be kept in capacity set {set_name}: its "
            f"{fabric} fabric allocates partitions of "
            f"{', '.join(map(str, allowed))} GPU{'s' * (allowed != (1,))}"
        )
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus <= 0:
        problems["gpus"] = f"must be a whole number of GPUs, 1 or more, got {gpus!r}"
    elif "block_gpus" not in problems and gpus % block:
        problems["gpus"] = (
            f"must be whole blocks of {block} GPUs: {gpus} is not a multiple of {block}"
        )


def _window(data: Mapping, problems: dict[str, str]) -> calendar.Window | None:
    always = data.get("always", False)
    if not isinstance(always, bool):
        problems["always"] = f"must be true or false, got {always!r}"
        return None
    given = [key for key in spec.WINDOW_FIELDS if data.get(key) not in (None, "", [])]
    if always:
        if given:
            problems["always"] = (
                "a reservation always in force has no window: leave out " + ", ".join(given)
            )
        return None
    if not given:
        problems["always"] = (
            "give a weekly window (days, start, end, time_zone) or always: true for a "
            "reservation in force at all times"
        )
        return None
    return spec.read_window(data, problems)


def _same_tenant_clash(tenant, proposal: Proposal, others, now: datetime) -> str:
    """Why the tenant cannot have this reservation beside another of its own in the set."""
    for other in others:
        if other.tenant_id != tenant.pk:
            continue
        at = _overlap(proposal.window, reservation_window(other), now)
        if at is not None:
            zone = proposal.window.zone if proposal.window else "UTC"
            return (
                f"{tenant.slug} has reservation {other.name!r} in capacity set "
                f"{other.capacity_set.name} already ({describe_when(reservation_window(other))}),"
                f" in force at the same time from {_when(at, zone)}: a tenant has one "
                "reservation in force in a set at a time; change that one instead"
            )
    return ""


def _overlap(first, second, now: datetime) -> datetime | None:
    if first is None and second is None:
        return now
    if first is None or second is None:
        window = first or second
        found = window.occurrences(now, now + calendar.CONFLICT_HORIZON)
        return max(found[0][0], now) if found else None
    return calendar.windows_overlap(first, second, now)


def _crowding(proposal: Proposal, others, reservable: int, now: datetime) -> str:
    """Why the set's reservations in force together with this one would keep more GPUs than
    it has (checked at every moment one of them comes into force while this one is)."""
    until = now + calendar.CONFLICT_HORIZON

    def spans(window):
        return [(now, until)] if window is None else window.occurrences(now, until)

    mine = spans(proposal.window)
    if not mine:
        return ""
    theirs = [(other, spans(reservation_window(other))) for other in others]
    moments = sorted({max(start, now) for _, found in theirs for start, _ in found} | {mine[0][0]})
    for moment in moments:
        if not _covers(mine, moment):
            continue
        along = [other for other, found in theirs if _covers(found, moment)]
        total = proposal.gpus + sum(other.gpus for other in along)
        if total > reservable:
            zone = proposal.window.zone if proposal.window else "UTC"
            names = ", ".join(
                f"{other.name} ({other.tenant.slug}, {other.gpus})" for other in along
            )
            return (
                f"with {names} in force at the same time (from {_when(moment, zone)}), the "
                f"set's reservations would keep {total} GPUs; it has {reservable}"
            )
    return ""


def _covers(spans: list[tuple[datetime, datetime]], moment: datetime) -> bool:
    index = bisect.bisect_right(spans, (moment, datetime.max.replace(tzinfo=moment.tzinfo)))
    return index > 0 and spans[index - 1][0] <= moment < spans[index - 1][1]


def _when(moment: datetime, zone: str) -> str:
    return f"{moment.astimezone(ZoneInfo(zone)):%a %Y-%m-%d %H:%M} {zone}"


# --- writes ------------------------------------------------------------------------------------


def _write(row: Reservation, proposal: Proposal) -> None:
    row.name, row.gpus, row.block_gpus = proposal.name, proposal.gpus, proposal.block_gpus
    window = proposal.window
    row.always = window is None
    row.days = [] if window is None else sorted(window.days)
    row.start_time = None if window is None else window.start
    row.end_time = None if window is None else window.end
    row.time_zone = "" if window is None else window.zone
    row.save()


def _changed(capacity_set: CapacitySet, now: datetime) -> None:
    fleet.capacity_set_bump(capacity_set_id=capacity_set.pk)
    following = set_next_reservation_change(capacity_set.pk, now)
    if following is not None:
        wake_at(BOUNDARY_TASK, capacity_set.pk, following)


def _fields(row: Reservation) -> dict:
    return {
        "tenant": row.tenant.slug,
        "capacity_set": row.capacity_set.name,
        **{key: value for key, value in written(row).items() if key != "name"},
        "name": row.name,
    }


def _user(actor: Actor):
    return actor if actor is not None and getattr(actor, "is_authenticated", False) else None


def _vms():
    """The rentals' VM model, by name: that app sits above this one."""
    return apps.get_model("rentals", "VirtualMachine")
