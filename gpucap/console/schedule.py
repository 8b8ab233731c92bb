"""The Schedule section of a capacity set's page (#18): the set's schedule entries with the
form that adds or replaces one, the outside scheduler's overrides with who set them, what is in
force now and where it comes from, and the 24-hour timeline (each boundary, what changes, and
the arbiter's dry-run plan at that moment: gpucap/plans/future.py).

Every write goes through gpucap/schedules/services.py; these views only read the form and put
the service's errors next to the fields they name. Under HTMX a write answers with the section
(refreshed, or with the form and its errors: 400) and ``HX-Trigger: set-changed`` so the page's
live regions (the pools' ranks and floors in force) follow at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django import forms
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from gpucap.fleet.models import CapacitySet
from gpucap.plans import future
from gpucap.plans.views import SET_CHANGED
from gpucap.schedules import calendar, services
from gpucap.schedules.models import PolicyOverride, ScheduleEntry
from gpucap.schedules.selectors import SetSchedule, set_schedule
from gpucap.web.forms import ServiceErrorsMixin
from gpucap.web.pages import operator_required, render_page, wants_fragment

# Zones offered as the form's suggestions (any IANA zone is accepted).
ZONES = (
    "UTC",
    "America/New_York",
    "America/Chicago",
    "America/Los_Angeles",
    "Europe/London",
    "Europe/Berlin",
    "Asia/Tokyo",
    "Asia/Singapore",
    "Australia/Sydney",
)
DAYS = [(day, name.title()) for day, name in enumerate(calendar.DAY_NAMES)]


class ScheduleEntryForm(ServiceErrorsMixin, forms.Form):
    """A schedule entry as the set page writes it: a weekly window and, per pool, a floor, a
    rank order, and per deployment a replica range (blank: not set by this entry). The form
    only gathers the written form; `services.schedule_entry_save` judges it."""

    name = forms.CharField(
        label="Name", max_length=64, help_text="Saving under an existing name replaces it."
    )
    days = forms.TypedMultipleChoiceField(
        label="Days it starts on",
        choices=DAYS,
        coerce=int,
        required=False,
        widget=forms.CheckboxSelectMultiple,
    )
    start = forms.CharField(label="From", widget=forms.TimeInput(attrs={"type": "time"}))
    end = forms.CharField(
        label="Until",
        widget=forms.TimeInput(attrs={"type": "time"}),
        help_text="At or before the start: the window ends the next day.",
    )
    time_zone = forms.CharField(
        label="Time zone",
        initial="UTC",
        widget=forms.TextInput(attrs={"list": "schedule-zones", "autocomplete": "off"}),
    )
    rank_order = forms.CharField(
        label="Rank order",
        required=False,
        help_text="Pools, highest priority first, comma-separated; they swap places among "
        "their own ranks while the window is open.",
    )

    def __init__(self, data=None, *, schedule: SetSchedule, initial: dict | None = None) -> None:
        super().__init__(data, initial=initial)
        self.pools = list(schedule.base.pools)
        self.deployments = list(schedule.base.deployments)
        self.error_fields = {}
        for pool in self.pools:
            field = f"floor__{pool}"
            self.fields[field] = forms.IntegerField(label=pool, required=False, min_value=0)
            self.error_fields.update({f"pools.{pool}.floor_gpus": field, f"pools.{pool}": field})
        for slug in self.deployments:
            for bound in ("min", "max"):
                field = f"{bound}__{slug}"
                self.fields[field] = forms.IntegerField(
                    label=f"{slug} {bound}", required=False, min_value=0
                )
                self.error_fields[f"deployments.{slug}.{bound}_replicas"] = field
            self.error_fields[f"deployments.{slug}"] = f"min__{slug}"

    @staticmethod
    def initial_for(entry: calendar.Entry) -> dict:
        """The form's fields for an existing entry (to edit and save it again)."""
        window = entry.window
        initial = {
            "name": entry.name,
            "days": sorted(window.days),
            "start": window.start.strftime("%H:%M"),
            "end": window.end.strftime("%H:%M"),
            "time_zone": window.zone,
        }
        for change in entry.changes:
            if change.setting == calendar.FLOOR_GPUS:
                initial[f"floor__{change.target}"] = change.value
            elif change.setting == calendar.RANK_ORDER:
                initial["rank_order"] = ", ".join(change.value)
            else:
                bound = change.setting.removesuffix("_replicas")
                initial[f"{bound}__{change.target}"] = change.value
        return initial

    def floor_fields(self) -> list[forms.BoundField]:
        return [self[f"floor__{pool}"] for pool in self.pools]

    def replica_fields(self) -> list[tuple[str, forms.BoundField, forms.BoundField]]:
        return [(slug, self[f"min__{slug}"], self[f"max__{slug}"]) for slug in self.deployments]

    def written(self) -> dict:
        """The entry in its written form (gpucap/schedules/spec.py)."""
        data = self.cleaned_data
        written = {key: data[key] for key in ("name", "days", "start", "end", "time_zone")}
        floors = {
            pool: {calendar.FLOOR_GPUS: data[f"floor__{pool}"]}
            for pool in self.pools
            if data.get(f"floor__{pool}") is not None
        }
        if floors:
            written["pools"] = floors
        if data.get("rank_order", "").strip():
            written["rank_order"] = [
                name.strip() for name in data["rank_order"].split(",") if name.strip()
            ]
        ranges = {}
        for slug in self.deployments:
            bounds = {
                f"{bound}_replicas": data[f"{bound}__{slug}"]
                for bound in ("min", "max")
                if data.get(f"{bound}__{slug}") is not None
            }
            if bounds:
                ranges[slug] = bounds
        if ranges:
            written["deployments"] = ranges
        return written


@dataclass(frozen=True)
class EntryRow:
    row: ScheduleEntry
    window: str
    sets: list[str]
    open_now: bool


@dataclass(frozen=True)
class OverrideRow:
    row: PolicyOverride
    sets: list[str]
    active_now: bool


def schedule_context(
    capacity_set: CapacitySet, *, now: datetime, form: ScheduleEntryForm | None = None
) -> dict:
    """What the Schedule section shows (six queries, whatever the schedule's size)."""
    schedule = set_schedule(capacity_set)
    policy = schedule.policy_at(now)
    entries = [
        EntryRow(
            row=row,
            window=entry.window.describe(),
            sets=[change.describe() for change in entry.changes],
            open_now=entry.window.active_at(now),
        )
        for row, entry in zip(schedule.entry_rows, schedule.entries, strict=True)
    ]
    overrides = [
        OverrideRow(
            row=row,
            sets=[change.describe() for change in override.changes],
            active_now=override.active_at(now),
        )
        for row, override in zip(schedule.override_rows, schedule.overrides, strict=True)
    ]
    return {
        "capacity_set": capacity_set,
        "schedule_entries": entries,
        "schedule_overrides": overrides,
        "in_force": _in_force(schedule, policy),
        "entry_form": form or ScheduleEntryForm(schedule=schedule),
        "zones": ZONES,
    }


def _in_force(schedule: SetSchedule, policy: calendar.Policy) -> list[tuple[str, str]]:
    """Each value in force now that is not the set's own, in words, with where it comes
    from."""
    lines = []
    for (setting, target), source in sorted(policy.sources.items()):
        if setting == calendar.FLOOR_GPUS:
            own = schedule.base.pools[target][1]
            what = f"pool {target} floor {policy.floors[target]} GPUs (own {own})"
        elif setting == calendar.RANK_ORDER:
            order = sorted(policy.ranks, key=policy.ranks.__getitem__)
            what = f"rank order {' > '.join(order)}"
        else:
            low, high = policy.replicas[target]
            own_low, own_high = schedule.base.deployments[target]
            what = f"deployment {target} replicas {low}-{high} (own {own_low}-{own_high})"
        lines.append((what, source))
    return lines


def _capacity_set(name: str) -> CapacitySet:
    return get_object_or_404(CapacitySet.objects.select_related("cluster"), name=name)


def _answer(
    request: HttpRequest,
    capacity_set: CapacitySet,
    *,
    form: ScheduleEntryForm | None = None,
    status: int = 200,
    editing: str = "",
) -> HttpResponse:
    """The refreshed section under HTMX (with the page's event after a write); without
    JavaScript, the set page after a write, or the section on a page of its own (a refused
    write with its errors, an entry to edit)."""
    if status == 200 and not editing and not wants_fragment(request):
        return redirect("fleet:capacity-set-detail", name=capacity_set.name)
    context = {
        "nav": "capacity_sets",
        **schedule_context(capacity_set, now=timezone.now(), form=form),
        "editing": editing,
    }
    template = (
        "console/set_schedule.html#set-schedule"
        if wants_fragment(request)
        else "console/set_schedule_page.html"
    )
    response = render(request, template, context, status=status)
    if status == 200 and not editing:
        response["HX-Trigger"] = SET_CHANGED
    return response


@require_POST
@operator_required
def schedule_entry_save(request: HttpRequest, name: str) -> HttpResponse:
    """Add an entry to the set's schedule, or replace the one of that name."""
    capacity_set = _capacity_set(name)
    form = ScheduleEntryForm(request.POST, schedule=set_schedule(capacity_set))
    if not form.is_valid():
        return _answer(request, capacity_set, form=form, status=400)
    try:
        services.schedule_entry_save(
            capacity_set=capacity_set, data=form.written(), actor=request.user
        )
    except ValidationError as exc:
        form.add_service_errors(exc)
        return _answer(request, capacity_set, form=form, status=400)
    return _answer(request, capacity_set)


@require_GET
@operator_required
def schedule_entry_edit(request: HttpRequest, name: str, entry: str) -> HttpResponse:
    """The section with the form filled in with the entry, to change and save it again."""
    capacity_set = _capacity_set(name)
    schedule = set_schedule(capacity_set)
    found = next((e for e in schedule.entries if e.name == entry), None)
    if found is None:
        raise Http404(f"capacity set {capacity_set.name} has no schedule entry {entry!r}")
    initial = ScheduleEntryForm.initial_for(found)
    form = ScheduleEntryForm(schedule=schedule, initial=initial)
    return _answer(request, capacity_set, form=form, editing=entry)


@require_POST
@operator_required
def schedule_entry_delete(request: HttpRequest, name: str, entry: str) -> HttpResponse:
    capacity_set = _capacity_set(name)
    row = get_object_or_404(ScheduleEntry, capacity_set=capacity_set, name=entry)
    services.schedule_entry_delete(entry=row, actor=request.user)
    return _answer(request, capacity_set)


@require_POST
@operator_required
def policy_override_clear(request: HttpRequest, name: str, override: str) -> HttpResponse:
    capacity_set = _capacity_set(name)
    row = get_object_or_404(PolicyOverride, capacity_set=capacity_set, name=override)
    services.policy_override_clear(override=row, actor=request.user)
    return _answer(request, capacity_set)


@require_GET
@operator_required
def schedule_timeline(request: HttpRequest, name: str) -> HttpResponse:
    """The next 24 hours of the set's schedule: each boundary, what changes, and what the
    arbiter would do then on today's fleet. A dry run: stores and changes nothing."""
    capacity_set = _capacity_set(name)
    now = timezone.now()
    context = {
        "nav": "capacity_sets",
        "capacity_set": capacity_set,
        "timeline": future.timeline(capacity_set, now),
        "timeline_from": now,
        "timeline_hours": future.HOURS,
    }
    return render_page(request, "console/set_timeline.html", context, fragment="timeline")
