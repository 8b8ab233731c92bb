"""Operator pages of the load simulator on one capacity set (issue 21): the set's stored
simulations with the form that starts one, and one run's page (its progress while a worker
carries it out, then its figures, timeline and worst moments, or two configurations side by
side).

The form reads where the load comes from (an uploaded JSON profile or one CSV curve, pasted
JSON, or the router's own counters of the last days) and what an edited configuration changes
(ranks, floors, replica ranges, which schedule entries stay); `simulation_runs.simulation_request`
says what is allowed, and its errors land next to the field they name.
"""

from __future__ import annotations

import json

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from gpucap.fleet.models import CapacitySet, Pool
from gpucap.inference.load_profile import recorded_profile
from gpucap.inference.models import InferenceDeployment
from gpucap.plans.models import SimulationRun
from gpucap.plans.simulation_runs import simulation_request
from gpucap.schedules import calendar, spec
from gpucap.schedules.selectors import set_schedule
from gpucap.simulation import ProfileError, curve_from_csv
from gpucap.web.forms import ServiceErrorsMixin
from gpucap.web.pages import operator_required, render_page

# How many runs the set page's section lists; the rest are on the simulations page.
SET_PAGE_RUNS = 5
RUNS_PER_PAGE = 20
PROFILE_BYTES = 2 * 1024 * 1024
SOURCES = (
    ("file", "Upload a file"),
    ("text", "Paste JSON"),
    ("recorded", "The router's counters"),
)


class SimulationForm(ServiceErrorsMixin, forms.Form):
    """A simulation to start: its load, its length, and the configuration to compare with
    today's. Per pool a rank and a floor, per deployment a replica range, prefilled with the
    values in force; a value left as it is changes nothing, and with nothing changed the run
    shows today's policy alone."""

    name = forms.CharField(
        label="Name",
        required=False,
        max_length=120,
        help_text="To find it again, e.g. “chat doubles at 09:00”.",
    )
    source = forms.ChoiceField(
        label="Load from", choices=SOURCES, initial="file", widget=forms.RadioSelect
    )
    profile_file = forms.FileField(
        label="Profile file",
        required=False,
        help_text="A JSON profile, or a CSV curve seconds_from_start,requests_per_second for one "
        "deployment (chosen below).",
    )
    profile_text = forms.CharField(
        label="Profile (JSON)",
        required=False,
        help_text='For example {"deployments": {"chat": {"points": [[0, 40], [32400, 80]], '
        '"shape": "step", "service_seconds": 0.5}}}: requests per second from seconds after '
        "the start (docs/simulation.md).",
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "class": "mono"}),
    )
    csv_deployment = forms.ChoiceField(label="CSV curve for", required=False)
    csv_service_seconds = forms.FloatField(
        label="Seconds a request", required=False, initial=0.5, min_value=0.001
    )
    recorded_days = forms.IntegerField(
        label="Last days",
        required=False,
        initial=7,
        min_value=1,
        max_value=settings.LOAD_HISTORY_DAYS,
        help_text=f"The router's counters are kept {settings.LOAD_HISTORY_DAYS} days.",
    )
    recorded_fold = forms.ChoiceField(
        label="As",
        required=False,
        choices=[("day", "one typical day"), ("replay", "the days as they were")],
        initial="day",
    )
    hours = forms.IntegerField(label="Hours", initial=24, min_value=1, max_value=168)
    step_seconds = forms.IntegerField(label="Step (s)", initial=60, min_value=10, max_value=3600)
    wait_threshold_seconds = forms.FloatField(
        label="Late after (s)",
        initial=1.0,
        min_value=0.001,
        help_text="A request waiting longer counts as late.",
    )

    def __init__(
        self,
        data=None,
        files=None,
        *,
        capacity_set: CapacitySet,
        pools: list[Pool],
        deployments: list[InferenceDeployment],
        entries: tuple[calendar.Entry, ...],
        initial: dict | None = None,
    ) -> None:
        super().__init__(data, files, initial=initial)
        self.capacity_set = capacity_set
        self.pools, self.deployments, self.entries = pools, deployments, entries
        self.fields["csv_deployment"].choices = [(d.slug, d.slug) for d in deployments]
        for pool in pools:
            self.fields[f"rank__{pool.name}"] = forms.IntegerField(
                label=f"{pool.name} rank", initial=pool.rank, min_value=1
            )
            self.fields[f"floor__{pool.name}"] = forms.IntegerField(
                label=f"{pool.name} floor (GPUs)", initial=pool.floor_gpus, min_value=0
            )
        for deployment in deployments:
            self.fields[f"min__{deployment.slug}"] = forms.IntegerField(
                label=f"{deployment.slug} min replicas",
                initial=deployment.min_replicas,
                min_value=0,
            )
            self.fields[f"max__{deployment.slug}"] = forms.IntegerField(
                label=f"{deployment.slug} max replicas",
                initial=deployment.max_replicas,
                min_value=0,
            )
        self.fields["keep_entries"] = forms.MultipleChoiceField(
            label="Schedule entries kept",
            required=False,
            choices=[(entry.name, entry.name) for entry in entries],
            initial=[entry.name for entry in entries],
            widget=forms.CheckboxSelectMultiple,
        )
        # Fields a service error names, by the service's key.
        self.error_fields = {
            **{f"changes.pools.{p.name}.rank": f"rank__{p.name}" for p in pools},
            **{f"changes.pools.{p.name}.floor_gpus": f"floor__{p.name}" for p in pools},
            **{f"changes.deployments.{d.slug}.min_replicas": f"min__{d.slug}" for d in deployments},
            **{f"changes.deployments.{d.slug}.max_replicas": f"max__{d.slug}" for d in deployments},
        }

    # --- how the page lays the fields out --------------------------------------------------------

    def load_fields(self):
        return [self[name] for name in ("name", "source")]

    def sources(self) -> list:
        """Each place the load may come from: its radio button and its fields."""
        names = {
            "file": ("profile_file", "csv_deployment", "csv_service_seconds"),
            "text": ("profile_text",),
            "recorded": ("recorded_days", "recorded_fold"),
        }
        return [
            (radio, [self[name] for name in names[radio.data["value"]]]) for radio in self["source"]
        ]

    def length_fields(self):
        return [self[name] for name in ("hours", "step_seconds", "wait_threshold_seconds")]

    def pool_rows(self):
        return [
            (pool, self[f"rank__{pool.name}"], self[f"floor__{pool.name}"]) for pool in self.pools
        ]

    def deployment_rows(self):
        return [(d, self[f"min__{d.slug}"], self[f"max__{d.slug}"]) for d in self.deployments]

    # --- reading it -------------------------------------------------------------------------------

    def clean(self) -> dict:
        data = super().clean()
        source = data.get("source")
        if source == "file":
            data["profile"] = self._profile_from_file(data.get("profile_file"))
        elif source == "text":
            data["profile"] = self._profile_from_text(data.get("profile_text") or "")
        elif source == "recorded" and data.get("recorded_days") is None:
            self.add_error("recorded_days", "say how many days of the router's counters")
        return data

    def _profile_from_file(self, upload) -> dict | None:
        if upload is None:
            self.add_error("profile_file", "choose a profile file")
            return None
        if upload.size > PROFILE_BYTES:
            self.add_error("profile_file", f"is over {PROFILE_BYTES // (1024 * 1024)} MiB")
            return None
        try:
            text = upload.read().decode("utf-8")
        except UnicodeDecodeError:
            self.add_error("profile_file", "must be UTF-8 text (JSON or CSV)")
            return None
        if not upload.name.lower().endswith(".csv"):
            return self._json(text, "profile_file")
        slug = self.cleaned_data.get("csv_deployment")
        if not slug:
            self.add_error("csv_deployment", "choose the deployment the CSV curve is for")
            return None
        try:
            curve = curve_from_csv(text, where="rows")
        except ProfileError as error:
            for where, why in error.problems.items():
                self.add_error("profile_file", f"{where}: {why}")
            return None
        service = self.cleaned_data.get("csv_service_seconds") or 0.5
        return {"deployments": {slug: {**curve.to_dict(), "service_seconds": service}}}

    def _profile_from_text(self, text: str) -> dict | None:
        if not text.strip():
            self.add_error("profile_text", "paste a profile in JSON")
            return None
        return self._json(text, "profile_text")

    def _json(self, text: str, field: str) -> dict | None:
        try:
            profile = json.loads(text)
        except ValueError as error:
            self.add_error(field, f"is not JSON: {error}")
            return None
        if not isinstance(profile, dict):
            self.add_error(field, "must be a JSON object with deployments and pools")
            return None
        return profile

    def changes(self) -> dict:
        """What the edited configuration changes, in the service's form ({} for nothing)."""
        data, changes = self.cleaned_data, {}
        pools = self._edited(
            {p.name: {"rank": p.rank, "floor_gpus": p.floor_gpus} for p in self.pools},
            {"rank": "rank__", "floor_gpus": "floor__"},
        )
        deployments = self._edited(
            {
                d.slug: {"min_replicas": d.min_replicas, "max_replicas": d.max_replicas}
                for d in self.deployments
            },
            {"min_replicas": "min__", "max_replicas": "max__"},
        )
        if pools:
            changes["pools"] = pools
        if deployments:
            changes["deployments"] = deployments
        kept = set(data.get("keep_entries") or ())
        if kept != {entry.name for entry in self.entries}:
            changes["schedule"] = [_written(e) for e in self.entries if e.name in kept]
        return changes

    def _edited(self, today: dict[str, dict], fields: dict[str, str]) -> dict:
        """Per name, the settings whose field differs from today's value."""
        edited = {}
        for name, values in today.items():
            changed = {
                setting: self.cleaned_data[f"{prefix}{name}"]
                for setting, prefix in fields.items()
                if self.cleaned_data[f"{prefix}{name}"] != values[setting]
            }
            if changed:
                edited[name] = changed
        return edited

    def add_service_errors(self, error: ValidationError) -> None:
        """A profile's problems go to the field the profile came from."""
        source = {"file": "profile_file", "text": "profile_text", "recorded": "recorded_days"}[
            self.cleaned_data["source"]
        ]
        if hasattr(error, "error_dict"):
            moved: dict[str, list] = {}
            for name, errors in error.error_dict.items():
                if name == "profile" or name.startswith("profile."):
                    where = name.removeprefix("profile").lstrip(".")
                    messages = [m for e in errors for m in e.messages]
                    moved.setdefault(source, []).extend(
                        f"{where}: {m}" if where else m for m in messages
                    )
                else:
                    moved.setdefault(name, []).extend(errors)
            error = ValidationError(moved)
        super().add_service_errors(error)


# --- pages ---------------------------------------------------------------------------------------


def _capacity_set(name: str) -> CapacitySet:
    return get_object_or_404(CapacitySet.objects.select_related("cluster"), name=name)


def _form(capacity_set: CapacitySet, data=None, files=None, initial=None) -> SimulationForm:
    return SimulationForm(
        data,
        files,
        capacity_set=capacity_set,
        pools=list(capacity_set.pools.order_by("rank", "name")),
        deployments=list(
            InferenceDeployment.objects.filter(pool__capacity_set=capacity_set).order_by("slug")
        ),
        entries=set_schedule(capacity_set).entries,
        initial=initial,
    )


def runs_of(capacity_set: CapacitySet):
    """A set's runs, newest first, without their results (they are large)."""
    return (
        SimulationRun.objects.filter(capacity_set=capacity_set)
        .select_related("requested_by")
        .defer("result", "variant_result", "profile", "start")
        .order_by("-created_at", "-pk")
    )


@require_GET
@operator_required
def simulations_section(request: HttpRequest, name: str) -> HttpResponse:
    """The set page's Simulations section (loaded after the page): the latest runs."""
    capacity_set = _capacity_set(name)
    context = {
        "capacity_set": capacity_set,
        "runs": list(runs_of(capacity_set)[:SET_PAGE_RUNS]),
        "more": runs_of(capacity_set).count() > SET_PAGE_RUNS,
    }
    return render_page(
        request, "plans/simulations_section.html", context, fragment="simulations-section"
    )


@require_http_methods(["GET", "POST"])
@operator_required
def simulations(request: HttpRequest, name: str) -> HttpResponse:
    """Every stored run of the set, and the form that starts one. A good form is answered by
    the new run's page (its progress); a bad one is a 400 with each reason next to its field,
    and nothing stored."""
    capacity_set = _capacity_set(name)
    status = 200
    if request.method == "POST":
        form = _form(capacity_set, request.POST, request.FILES)
        run = _started(request, capacity_set, form)
        if run is not None:
            return redirect("plans:simulation", name=capacity_set.name, run_id=run.pk)
        status = 400
    else:
        form = _form(capacity_set, initial=_again(capacity_set, request.GET.get("again")))
    page = Paginator(runs_of(capacity_set), RUNS_PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "nav": "capacity_sets",
        "capacity_set": capacity_set,
        "form": form,
        "page": page,
        "again": request.GET.get("again") or request.POST.get("again") or "",
    }
    return render_page(
        request, "plans/simulations_page.html", context, fragment="simulation-form", status=status
    )


def _started(
    request: HttpRequest, capacity_set: CapacitySet, form: SimulationForm
) -> SimulationRun | None:
    if not form.is_valid():
        return None
    data = form.cleaned_data
    from_run = None
    if request.POST.get("same_start") and request.POST.get("again", "").isdigit():
        from_run = SimulationRun.objects.filter(
            pk=int(request.POST["again"]), capacity_set=capacity_set
        ).first()
    profile = data.get("profile")
    if data["source"] == "recorded":
        profile = _recorded(capacity_set, data)
    try:
        return simulation_request(
            capacity_set,
            profile=profile,
            changes=form.changes(),
            name=data["name"],
            hours=data["hours"],
            step_seconds=data["step_seconds"],
            wait_threshold_seconds=data["wait_threshold_seconds"],
            from_run=from_run,
            by=request.user,
        )
    except ValidationError as error:
        form.add_service_errors(error)
        return None


def _recorded(capacity_set: CapacitySet, data: dict) -> dict:
    return recorded_profile(
        capacity_set,
        days=data["recorded_days"],
        now=timezone.now(),
        fold=data.get("recorded_fold") or "day",
    )


def _again(capacity_set: CapacitySet, run_id: str | None) -> dict | None:
    """The form filled in as an earlier run was asked for ("Run again")."""
    if not run_id or not run_id.isdigit():
        return None
    run = SimulationRun.objects.filter(pk=int(run_id), capacity_set=capacity_set).first()
    if run is None:
        return None
    initial = {
        "name": run.name,
        "source": "text",
        "profile_text": json.dumps(run.profile, indent=1),
        "hours": max(run.duration_seconds // 3600, 1),
        "step_seconds": run.step_seconds,
        "wait_threshold_seconds": run.wait_threshold_seconds,
    }
    changes = run.changes or {}
    for pool, edited in (changes.get("pools") or {}).items():
        if "rank" in edited:
            initial[f"rank__{pool}"] = edited["rank"]
        if "floor_gpus" in edited:
            initial[f"floor__{pool}"] = edited["floor_gpus"]
    for slug, edited in (changes.get("deployments") or {}).items():
        if "min_replicas" in edited:
            initial[f"min__{slug}"] = edited["min_replicas"]
        if "max_replicas" in edited:
            initial[f"max__{slug}"] = edited["max_replicas"]
    schedule = changes.get("schedule")
    if isinstance(schedule, list):
        initial["keep_entries"] = [entry.get("name") for entry in schedule]
    return initial


def _written(entry: calendar.Entry) -> dict:
    """A schedule entry in the form the schedule API takes (and `changes.schedule` too)."""
    window = entry.window
    return {
        "name": entry.name,
        "days": sorted(window.days),
        "start": f"{window.start:%H:%M}",
        "end": f"{window.end:%H:%M}",
        "time_zone": window.zone,
        **spec.written(list(entry.changes)),
    }


@require_GET
@operator_required
def simulation(request: HttpRequest, name: str, run_id: int) -> HttpResponse:
    """One run: while queued or running, its progress (the fragment polls itself); then its
    figures, timeline and worst moments, or both configurations side by side."""
    capacity_set = _capacity_set(name)
    run = get_object_or_404(
        SimulationRun.objects.select_related("requested_by").defer("start"),
        pk=run_id,
        capacity_set=capacity_set,
    )
    context = {
        "nav": "capacity_sets",
        "capacity_set": capacity_set,
        "run": run,
        "pool_kinds": dict(capacity_set.pools.values_list("name", "kind")),
    }
    return render_page(request, "plans/simulation_page.html", context, fragment="simulation-run")
