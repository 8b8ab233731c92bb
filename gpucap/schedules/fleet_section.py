"""A capacity set's schedule in the fleet file: the ``schedules:`` key of a set's entry.

The fleet file (gpucap/fleet/fleetfile/) sits below this app; `SCHEDULES` is handed to it from
`SchedulesConfig.ready()` (gpucap/fleet/fleetfile/sections.py). Each item is a schedule entry in
its written form (gpucap/schedules/spec.py, the reader the API and the set page use too)::

    capacity_sets:
      - name: h100-east
        ...
        schedules:
          - name: day-shift
            days: mon-fri
            start: "08:00"
            end: "20:00"
            time_zone: America/New_York
            pools: {h100-inference: {floor_gpus: 32}}

Left out, a set's entries are left as they are; given (even ``schedules: []``), the set's
schedule is what the file lists: entries it does not list are deleted. Entries are written
through `schedule_entry_save` / `schedule_entry_delete`, only when they differ from the file,
so applying a file twice changes nothing. Overrides are temporary and never in the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, time

from django.db.models import Prefetch
from django.utils import timezone

from gpucap.fleet.fleetfile.sections import SectionPlan, SectionSpec
from gpucap.fleet.fleetfile.words import shown, unknown_key
from gpucap.fleet.models import CapacitySet, Pool
from gpucap.inference.models import InferenceDeployment
from gpucap.schedules import calendar, services, spec
from gpucap.schedules.models import PolicyChange, ScheduleEntry
from gpucap.schedules.selectors import entry_of

KEYS = ("name", *spec.WINDOW_FIELDS, *spec.CHANGE_FIELDS)
REQUIRED = ("name", *spec.WINDOW_FIELDS)


class ScheduleSection:
    key = "schedules"
    noun = "schedule entry"
    plural = "schedule entries"

    @property
    def actions(self) -> dict:
        return {"schedule_entry_save": _entry_save, "schedule_entry_delete": _entry_delete}

    # --- as written ---------------------------------------------------------------------------

    def check(self, section: SectionSpec) -> list[str]:
        if not isinstance(section.value, list):
            return [
                f"{section.set_where}: {self.key}: must be a list of schedule entries (lines "
                f"starting with -), got {shown(section.value)}"
            ]
        lines = []
        first: dict[str, str] = {}
        for i, item in enumerate(section.value):
            label = item.get("name") if isinstance(item, dict) else None
            where = section.where(i, label)
            if not isinstance(item, dict):
                lines.append(f"{where}: must be a mapping of keys to values, got {shown(item)}")
                continue
            problems = _written_problems(item)
            if "name" not in problems:
                seen = first.setdefault(item["name"], where)
                if seen != where:
                    problems["name"] = f"{item['name']} is declared twice (first at {seen})"
            lines.extend(f"{where}: {field}: {reason}" for field, reason in problems.items())
        return lines

    # --- against the database -----------------------------------------------------------------

    def plan(self, plan: SectionPlan) -> None:
        now = timezone.now()
        for section in plan.specs:
            self._plan_set(plan, section, now)
        declared = {section.capacity_set for section in plan.specs}
        others = ScheduleEntry.objects.exclude(capacity_set__name__in=declared).order_by(
            "capacity_set__name", "name"
        )
        labels = [f"{s}/{n}" for s, n in others.values_list("capacity_set__name", "name")]
        if labels:
            plan.left_as_is(labels)

    def _plan_set(self, plan: SectionPlan, section: SectionSpec, now: datetime) -> None:
        set_name = section.capacity_set
        capacity_set = plan.capacity_set(set_name)
        # Pools the file creates are not rows yet: the reader only needs their names.
        pools = {name: Pool(name=name) for name in plan.pool_floors(set_name)}
        deployments = (
            {d.slug: d for d in InferenceDeployment.objects.filter(pool__capacity_set=capacity_set)}
            if capacity_set is not None
            else {}
        )
        fine = True
        entries: list[tuple[str, calendar.Entry, dict]] = []
        for i, data in enumerate(section.value):
            where = section.where(i, data.get("name"))
            problems: dict[str, str] = {}
            window = spec.read_window(data, problems)
            changes = spec.read_changes(
                data,
                pools=pools,
                deployments=deployments,
                set_gpus=plan.set_gpus(set_name),
                problems=problems,
            )
            floors = plan.pool_floors(set_name) | {
                c.pool.name: c.value for c in changes if c.setting == calendar.FLOOR_GPUS
            }
            if not problems and sum(floors.values()) > plan.set_gpus(set_name):
                problems["pools"] = (
                    f"floors would add up to {sum(floors.values())} GPUs while this is in "
                    f"force; the set has {plan.set_gpus(set_name)}"
                )
            for field, reason in problems.items():
                text = reason if field == "non_field_errors" else f"{field}: {reason}"
                plan.problem(where, text)
            if problems:
                fine = False
                continue
            changed = spec.as_calendar_changes(changes)
            entries.append((where, calendar.Entry(data["name"], window, changed), data))
        places = {entry.name: where for where, entry, _ in entries}
        zones = {entry.name: entry.window.zone for _, entry, _ in entries}
        for clash in calendar.conflicts([entry for _, entry, _ in entries], now):
            fine = False
            plan.problem(
                places[clash.second],
                f"conflicts with {places[clash.first]}: {clash.describe(zones[clash.first])}",
            )
        if fine:
            self._compare(plan, section, capacity_set, entries, now)

    def _compare(
        self,
        plan: SectionPlan,
        section: SectionSpec,
        capacity_set: CapacitySet | None,
        entries: list[tuple[str, calendar.Entry, dict]],
        now: datetime,
    ) -> None:
        stored = {}
        if capacity_set is not None:
            stored = {row.name: entry_of(row) for row in _entry_rows([capacity_set])}
        in_file = {entry.name for _, entry, _ in entries}
        # Deletions first: an entry renamed in the file frees its window before it is saved.
        deleted = sorted(set(stored) - in_file)
        for name in deleted:
            plan.change("delete", f"{section.capacity_set}/{name}", _words(stored[name]))
        saved = []
        for where, entry, data in entries:
            label = f"{section.capacity_set}/{entry.name}"
            before = stored.get(entry.name)
            if before is None:
                plan.change("create", label, _words(entry))
            elif before.window == entry.window and set(before.changes) == set(entry.changes):
                plan.unchanged()
                continue
            else:
                details = []
                if before.window != entry.window:
                    details.append(
                        f"window {before.window.describe()} -> {entry.window.describe()}"
                    )
                if set(before.changes) != set(entry.changes):
                    details.append(f"sets {_sets(before)} -> {_sets(entry)}")
                plan.change("update", label, details)
            saved.append((where, entry, data))
        for name in deleted + _in_the_way(stored, [entry for _, entry, _ in saved], now):
            plan.step(
                section.set_where,
                "schedule_entry_delete",
                capacity_set=section.capacity_set,
                name=name,
            )
        for where, _, data in saved:
            plan.step(
                where, "schedule_entry_save", capacity_set=section.capacity_set, data=dict(data)
            )

    # --- export ---------------------------------------------------------------------------------

    def export(self, capacity_sets: list[CapacitySet]) -> dict[str, list]:
        exported: dict[str, list] = {}
        for row in _entry_rows(capacity_sets):
            entry = entry_of(row)
            window = entry.window
            item = {
                "name": entry.name,
                "days": calendar.describe_days(window.days).lower(),
                "start": _clock(window.start),
                "end": _clock(window.end),
                "time_zone": window.zone,
            }
            for key, value in spec.written(list(entry.changes)).items():
                item[key] = dict(sorted(value.items())) if isinstance(value, Mapping) else value
            exported.setdefault(row.capacity_set.name, []).append(item)
        return exported


SCHEDULES = ScheduleSection()


def _in_the_way(
    stored: dict[str, calendar.Entry], saved: list[calendar.Entry], now: datetime
) -> list[str]:
    """Entries the file changes that, as the database still holds them, would clash with
    another one saved before them (two entries that swap windows): each is deleted first and
    saved again, so that no save meets a clash the file as a whole does not have."""
    waiting = {entry.name: stored[entry.name] for entry in saved if entry.name in stored}
    in_the_way = []
    for entry in saved:
        waiting.pop(entry.name, None)
        for clash in calendar.conflicts([entry, *waiting.values()], now):
            other = clash.second if clash.first == entry.name else clash.first
            if entry.name in (clash.first, clash.second) and other in waiting:
                in_the_way.append(other)
                del waiting[other]
    return in_the_way


def _written_problems(item: dict) -> dict[str, str]:
    """What is wrong with an entry as written, by field in the order of `KEYS` (what it sets
    is checked against the set's pools and deployments, with the database)."""
    problems: dict[str, str] = {}
    for key in item:
        if key not in KEYS:
            problems[str(key)] = unknown_key(str(key), KEYS)
    for key in REQUIRED:
        if item.get(key) is None:
            problems[key] = "is required"
    if "name" not in problems and (problem := spec.name_problem(item["name"])):
        problems["name"] = problem
    present = {key: item[key] for key in spec.WINDOW_FIELDS if item.get(key) is not None}
    found: dict[str, str] = {}
    spec.read_window(present, found)
    for key in present:
        if key in found:
            problems[key] = found[key]
    return {key: problems[key] for key in sorted(problems, key=_order)}


def _order(key: str) -> int:
    return KEYS.index(key) if key in KEYS else -1


def _entry_rows(capacity_sets: list[CapacitySet]):
    changes = PolicyChange.objects.select_related("pool", "deployment").order_by("pk")
    return (
        ScheduleEntry.objects.filter(capacity_set__in=capacity_sets)
        .select_related("capacity_set")
        .prefetch_related(Prefetch("changes", queryset=changes))
        .order_by("capacity_set__name", "name")
    )


def _words(entry: calendar.Entry) -> str:
    return f"{entry.window.describe()}: sets {_sets(entry)}"


def _sets(entry: calendar.Entry) -> str:
    return ", ".join(sorted(change.describe() for change in entry.changes))


def _clock(moment: time) -> str:
    return moment.strftime("%H:%M:%S" if moment.second else "%H:%M")


# --- the steps, run when the file applies (the set and its pools exist by then) ----------------


def _entry_save(*, capacity_set: str, data: dict, actor) -> None:
    services.schedule_entry_save(
        capacity_set=CapacitySet.objects.get(name=capacity_set), data=data, actor=actor
    )


def _entry_delete(*, capacity_set: str, name: str, actor) -> None:
    entry = ScheduleEntry.objects.select_related("capacity_set").get(
        capacity_set__name=capacity_set, name=name
    )
    services.schedule_entry_delete(entry=entry, actor=actor)
