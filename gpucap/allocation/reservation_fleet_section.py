"""Reservations in the fleet file: its top-level ``reservations:`` key, as ``quotas:`` is.

Handed to the fleet file (which sits below this app) from `AllocationConfig.ready()`. Each
item is one reservation, named uniquely in its set::

    reservations:
      - {tenant: acme, capacity_set: h100-east, name: acme-16, gpus: 16, block_gpus: 8,
         always: true}
      - {tenant: globex, capacity_set: h100-east, name: nights, gpus: 8, block_gpus: 8,
         days: mon-fri, start: "20:00", end: "08:00", time_zone: UTC}

Left out, the reservations are left as they are; given (even ``reservations: []``), they are
what the file lists: those it does not list are removed. They are written through
`reservation_create` / `reservation_update` / `reservation_delete` (the same refusals as the
API, checked when the file applies, after its sets and nodes exist), only when they differ from
the file, so applying a file twice changes nothing.
"""

from __future__ import annotations

from gpucap.allocation import services
from gpucap.allocation.models import Reservation
from gpucap.allocation.reservations import FIELDS, read_reservation, written
from gpucap.fleet.fleetfile.sections import SectionPlan, SectionSpec, list_problems
from gpucap.fleet.fleetfile.words import unknown_key
from gpucap.fleet.models import CapacitySet
from gpucap.tenancy.models import Tenant

KEYS = ("tenant", "capacity_set", *FIELDS)


class ReservationSection:
    key = "reservations"
    noun = "reservation"
    plural = "reservations"

    @property
    def actions(self) -> dict:
        return {"reservation_save": _save, "reservation_remove": _remove}

    def check(self, section: SectionSpec) -> list[str]:
        return list_problems(
            section,
            noun_plural="reservations",
            label=_label,
            item_problems=_written_problems,
            identity=_key,
            twice=("name", "a second reservation of this name in the set ({seen})"),
        )

    def plan(self, plan: SectionPlan) -> None:
        if not plan.specs:
            labels = [str(row) for row in _rows()]
            if labels:
                plan.left_as_is(labels)
            return
        (section,) = plan.specs
        tenants = plan.tenant_slugs()
        wanted: dict[tuple, tuple[str, dict]] = {}
        for i, item in enumerate(section.value):
            where = section.where(i, _label(item))
            set_name = item["capacity_set"]
            if item["tenant"] not in tenants:
                plan.problem(where, f"tenant: no tenant {item['tenant']!r} in the fleet or file")
            elif set_name not in plan.set_names and plan.capacity_set(set_name) is None:
                plan.problem(
                    where, f"capacity_set: no capacity set {set_name!r} in the fleet or file"
                )
            else:
                wanted[_key(item)] = (where, item)
        stored = {(row.capacity_set.name, row.name): row for row in _rows()}
        for key in sorted(set(stored) - set(wanted)):
            plan.change("delete", _label(_as_written(stored[key])), f"{stored[key].gpus} GPUs")
            plan.step("reservations", "reservation_remove", reservation_id=stored[key].pk)
        for key, (where, item) in wanted.items():
            before = stored.get(key)
            if before is not None and _normal(_as_written(before)) == _normal(item):
                plan.unchanged()
                continue
            plan.change("create" if before is None else "update", _label(item), _words(item))
            plan.step(where, "reservation_save", item=dict(item))

    def export_file(self) -> list:
        return [_as_written(row) for row in _rows()]


RESERVATIONS = ReservationSection()


def _rows():
    return Reservation.objects.select_related("tenant", "capacity_set").order_by(
        "capacity_set__name", "name"
    )


def _as_written(row: Reservation) -> dict:
    item = {"tenant": row.tenant.slug, "capacity_set": row.capacity_set.name, **written(row)}
    if not row.always:
        item.pop("always")
    return item


def _normal(item: dict) -> dict:
    """The item as stored would write it (days as numbers, no ``always: false``)."""
    problems: dict[str, str] = {}
    data = {key: value for key, value in item.items() if key not in ("tenant", "capacity_set")}
    window = read_reservation(data, problems)
    base = {key: item.get(key) for key in ("tenant", "capacity_set", "name", "gpus", "block_gpus")}
    if window is None:
        return {**base, "always": True}
    return {**base, "window": (sorted(window.days), window.start, window.end, window.zone)}


def _key(item: dict) -> tuple:
    return (item.get("capacity_set"), item.get("name"))


def _label(item: dict) -> str:
    return f"{item.get('tenant')}'s {item.get('name')} in {item.get('capacity_set')}"


def _words(item: dict) -> str:
    when = (
        "always"
        if item.get("always")
        else (f"{item.get('days')} {item.get('start')}-{item.get('end')} {item.get('time_zone')}")
    )
    return f"{item.get('gpus')} GPUs in blocks of {item.get('block_gpus')}, {when}"


def _written_problems(item: dict) -> dict[str, str]:
    """What is wrong with a reservation as written (the API's rules that need no database)."""
    problems: dict[str, str] = {}
    for key in item:
        if key not in KEYS:
            problems[str(key)] = unknown_key(str(key), KEYS)
    for key in ("tenant", "capacity_set"):
        if not isinstance(item.get(key), str) or not item[key].strip():
            problems[key] = f"is required: the {key.replace('_', ' ')}'s name"
    data = {key: value for key, value in item.items() if key in FIELDS}
    read_reservation(data, problems)
    return problems


# --- the steps, run when the file applies (tenants, sets and nodes exist by then) ---------------


def _save(*, item: dict, actor) -> None:
    capacity_set = CapacitySet.objects.get(name=item["capacity_set"])
    data = {key: value for key, value in item.items() if key in FIELDS}
    row = Reservation.objects.filter(capacity_set=capacity_set, name=item["name"]).first()
    tenant = Tenant.objects.get(slug=item["tenant"])
    if row is not None and row.tenant_id != tenant.pk:
        services.reservation_delete(reservation=row, actor=actor)
        row = None
    if row is None:
        services.reservation_create(
            tenant=tenant, capacity_set=capacity_set, data=data, actor=actor
        )
    else:
        data.setdefault("always", False)
        services.reservation_update(reservation=row, data=data, actor=actor)


def _remove(*, reservation_id: int, actor) -> None:
    row = Reservation.objects.filter(pk=reservation_id).first()
    if row is not None:
        services.reservation_delete(reservation=row, actor=actor)
