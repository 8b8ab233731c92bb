"""Operator pages of the load simulator on one capacity set (issue 21): the set's stored
simulations with the form that starts one, and one run's page (its progress while a worker
carries it out, then its figures, timeline and worst moments, or two configurations side by
side).

The form itself is `simulation_form.SimulationForm`; what a run may ask is
`simulation_runs.simulation_request`.
"""

from __future__ import annotations

import json

from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from gpucap.fleet.models import CapacitySet
from gpucap.inference.load_profile import recorded_profile
from gpucap.inference.models import InferenceDeployment
from gpucap.plans.models import SimulationRun
from gpucap.plans.simulation_form import SimulationForm
from gpucap.plans.simulation_runs import simulation_request
from gpucap.schedules.selectors import set_schedule
from gpucap.web.pages import operator_required, render_page

# How many runs the set page's section lists; the rest are on the simulations page.
SET_PAGE_RUNS = 5
RUNS_PER_PAGE = 20


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
    # One more than the section shows tells whether the "every run" link is needed.
    runs = list(runs_of(capacity_set)[: SET_PAGE_RUNS + 1])
    context = {
        "capacity_set": capacity_set,
        "runs": runs[:SET_PAGE_RUNS],
        "more": len(runs) > SET_PAGE_RUNS,
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
