"""Operator pages of the arbiter on one capacity set (DESIGN.md section 8): the arbiter's
regions of the set page (mode, pool bars, the plan in flight, the latest plan, plan history),
Approve, the mode switch, one stored plan's page and the what-if form.

The set page (`gpucap.console.views.capacity_set_detail`) includes ``plans/live.html``,
``plans/plans.html`` and ``plans/what_if.html`` with the context `set_page_context` builds, and
polls them with the rest of the page. Approve and the mode switch answer on the set page with
what happened (``#set-alert``) and an ``HX-Trigger: set-changed`` that makes the page's poll run
at once. Views adapt the request and call selectors or services; the rules (what Approve may
apply, when a plan is stale, what a what-if may ask) are the services'.
"""

from django import forms
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpucap.arbiter.topology import block_sizes
from gpucap.errors import Conflict
from gpucap.fleet.models import CapacitySet, Pool
from gpucap.plans import selectors, services
from gpucap.plans.models import Plan, PlanAction
from gpucap.web.forms import ServiceErrorsMixin
from gpucap.web.pages import operator_required, render_page, wants_fragment

Mode = CapacitySet.Mode


# --- the arbiter's regions of the set page -------------------------------------------------------

# The event an action on the set page sends so that the page's poll runs at once.
SET_CHANGED = "set-changed"


def set_page_context(capacity_set: CapacitySet, *, pools: list[Pool], gpu_total: int) -> dict:
    """What the set page's arbiter regions need, from what the page has read already. Five
    queries and a few more for an applied plan (`selectors.capacity_set_plans`)."""
    plans = selectors.capacity_set_plans(
        capacity_set=capacity_set, pools=pools, gpu_total=gpu_total
    )
    return live_context(capacity_set, plans)


def what_if_context(capacity_set: CapacitySet, *, pools: list[Pool]) -> dict:
    return {"what_if_form": WhatIfForm(capacity_set=capacity_set, pools=pools)}


def live_context(
    capacity_set: CapacitySet,
    plans: selectors.SetPlans,
    *,
    alert: str = "",
    changes: list[str] | None = None,
) -> dict:
    context = {
        "capacity_set": capacity_set,
        "plans": plans,
        "enforce_question": _enforce_question(capacity_set, plans.proposal),
        "dry_run_question": (
            f"Switch {capacity_set.name} to dry-run? New plans will only be shown; notices "
            "already sent keep their deadlines."
        ),
        "alert": alert,
        "changes": changes,
        "approve_target": "plan-live",
    }
    if plans.latest is not None:
        context.update(_plan_context(capacity_set, plans.latest))
    return context


def _plan_context(capacity_set: CapacitySet, lines: selectors.PlanLines) -> dict:
    plan = lines.plan
    return {
        "lines": lines,
        "plan": plan,
        "plan_is_behind": (
            plan.status == Plan.Status.PROPOSED and plan.generation != capacity_set.generation
        ),
        "can_approve": (
            capacity_set.mode == Mode.DRY_RUN
            and plan.status == Plan.Status.PROPOSED
            and plan.has_actions
        ),
        "approve_question": _approve_question(capacity_set, plan),
    }


def _approve_question(capacity_set: CapacitySet, plan: Plan) -> str:
    seconds = capacity_set.notice_seconds
    if plan.preemptions == 0:
        notices = "no VM gets a notice"
    elif plan.preemptions == 1:
        notices = f"1 VM gets a {seconds} s notice ({_gpus(plan.preempted_gpus)})"
    else:
        notices = f"{plan.preemptions} VMs get {seconds} s notices ({_gpus(plan.preempted_gpus)})"
    if plan.placements == 0:
        placed = "no demand is placed"
    elif plan.placements == 1:
        placed = "1 demand is placed"
    else:
        placed = f"{plan.placements} demands are placed"
    return f"Approve plan {plan.pk}? {notices}; {placed}"


def _enforce_question(capacity_set: CapacitySet, proposal: Plan | None) -> str:
    if proposal is None:
        current = "no plan waits for approval now"
    else:
        vms = "VM" if proposal.preemptions == 1 else "VMs"
        current = f"the current plan notifies {proposal.preemptions} {vms}"
    return (
        f"Enable enforcement on {capacity_set.name}? From now on every plan is applied as it is "
        f"made; {current}."
    )


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def _capacity_set(name: str) -> CapacitySet:
    return get_object_or_404(CapacitySet.objects.select_related("cluster"), name=name)


def _answer_on_set_page(
    request: HttpRequest,
    capacity_set: CapacitySet,
    *,
    alert: str = "",
    changes: list[str] | None = None,
    status: int = 200,
) -> HttpResponse:
    """What an action on the set page answers: under HTMX, what happened for ``#set-alert``
    (nothing when it went as asked) and the event that refreshes the page's regions; without
    JavaScript, the set page after success, or a page with the arbiter's regions and the
    reason."""
    if wants_fragment(request):
        response = render(
            request, "plans/alert.html", {"alert": alert, "changes": changes}, status=status
        )
        response["HX-Trigger"] = SET_CHANGED
        return response
    if status == 200:
        return redirect("fleet:capacity-set-detail", name=capacity_set.name)
    plans = selectors.capacity_set_plans(capacity_set=capacity_set)
    context = {
        "nav": "capacity_sets",
        **live_context(capacity_set, plans, alert=alert, changes=changes),
    }
    return render(request, "plans/live_page.html", context, status=status)


# --- Approve and the mode switch -----------------------------------------------------------------


@require_POST
@operator_required
def plan_approve(request: HttpRequest, name: str, plan_id: int) -> HttpResponse:
    """Apply exactly the plan the operator saw (its id is in the URL). A stale plan is refused
    with 409, what changed, and the fresh plan to review instead."""
    capacity_set = _capacity_set(name)
    plan = get_object_or_404(Plan, pk=plan_id, capacity_set=capacity_set)
    alert, changes, status, shown = "", None, 200, plan.pk
    try:
        services.plan_approve(plan=plan, actor=request.user)
    except services.StalePlan as exc:
        alert, status = f"Not approved: {exc.message}", 409
        if exc.fresh is not None:
            shown = exc.fresh.pk
            changes = services.plan_changes(plan, exc.fresh)
    except Conflict as exc:
        alert, status = f"Not approved: {exc.message}", 409
    capacity_set.refresh_from_db(fields=["mode", "generation"])
    if wants_fragment(request) and request.htmx.target == "plan-detail":
        response = _render_detail(
            request, capacity_set, shown, alert=alert, changes=changes, status=status
        )
        if shown != plan.pk:
            response["HX-Push-Url"] = reverse(
                "plans:detail", kwargs={"name": capacity_set.name, "plan_id": shown}
            )
        return response
    return _answer_on_set_page(request, capacity_set, alert=alert, changes=changes, status=status)


@require_POST
@operator_required
def capacity_set_mode(request: HttpRequest, name: str) -> HttpResponse:
    """Switch the set to ``enforce`` or back to ``dry_run`` (the form's ``mode``)."""
    capacity_set = _capacity_set(name)
    alert, status = "", 200
    try:
        services.capacity_set_set_mode(
            capacity_set=capacity_set, mode=request.POST.get("mode", ""), actor=request.user
        )
    except ValidationError as exc:
        alert, status = f"Not changed: {'; '.join(exc.messages)}", 400
    return _answer_on_set_page(request, _capacity_set(name), alert=alert, status=status)


# --- one plan ------------------------------------------------------------------------------------


@require_GET
@operator_required
def plan_detail(request: HttpRequest, name: str, plan_id: int) -> HttpResponse:
    """One stored plan, shown like the latest; Approve only while it is the set's proposal."""
    return _render_detail(request, _capacity_set(name), plan_id)


def _render_detail(
    request: HttpRequest,
    capacity_set: CapacitySet,
    plan_id: int,
    *,
    alert: str = "",
    changes: list[str] | None = None,
    status: int = 200,
) -> HttpResponse:
    plan = get_object_or_404(selectors.plans_list(), pk=plan_id, capacity_set=capacity_set)
    context = {
        "nav": "capacity_sets",
        "capacity_set": capacity_set,
        **_plan_context(capacity_set, selectors.plan_lines(plan)),
        "alert": alert,
        "changes": changes,
        "approve_target": "plan-detail",
    }
    return render_page(
        request, "plans/plan_detail.html", context, fragment="plan-detail", status=status
    )


# --- what-if -------------------------------------------------------------------------------------


class WhatIfForm(ServiceErrorsMixin, forms.Form):
    """The what-if question: pool X asks for N more GPUs in blocks of K. The form only reads
    the numbers; what a set can be asked for is `services.plan_what_if`'s to say, next to the
    field."""

    pool = forms.ChoiceField(label="Pool")
    gpus = forms.IntegerField(
        label="GPUs",
        initial=8,
        error_messages={
            "required": "say how many GPUs the pool asks for",
            "invalid": "must be a whole number of GPUs",
        },
        widget=forms.NumberInput(attrs={"min": 1}),
    )
    block_gpus = forms.IntegerField(label="In blocks of", error_messages={"invalid": "pick a size"})
    at = forms.DateTimeField(
        label="At (UTC)",
        required=False,
        help_text="Empty: now. A later time: with the policy the schedule puts in force then.",
        error_messages={"invalid": "must be a date and time, e.g. 2026-12-02 13:00"},
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )

    def __init__(self, data=None, *, capacity_set: CapacitySet, pools: list[Pool]) -> None:
        super().__init__(data)
        self.pools = {str(pool.pk): pool for pool in pools}
        pool = self.fields["pool"]
        pool.choices = [
            (pk, f"{p.rank}. {p.name} ({p.get_kind_display()})") for pk, p in self.pools.items()
        ]
        pool.error_messages["invalid_choice"] = f"choose a pool of capacity set {capacity_set.name}"
        sizes = block_sizes(capacity_set.fabric)
        self.fields["block_gpus"].widget = forms.Select(
            choices=[(size, f"{size} GPU" + ("" if size == 1 else "s")) for size in sizes]
        )
        self.initial.setdefault("block_gpus", max(sizes))

    def clean_pool(self) -> Pool:
        return self.pools[self.cleaned_data["pool"]]


@require_http_methods(["GET", "POST"])
@operator_required
def what_if(request: HttpRequest, name: str) -> HttpResponse:
    """Preview the set's plan with one more demand. Stores and changes nothing: bad input is a
    400 naming the field."""
    capacity_set = _capacity_set(name)
    pools = list(capacity_set.pools.order_by("rank"))
    data = request.POST if request.method == "POST" else request.GET
    bound = request.method == "POST" or any(field in data for field in ("pool", "gpus"))
    form = WhatIfForm(data if bound else None, capacity_set=capacity_set, pools=pools)
    result, status = None, 200
    if bound:
        status = 400
        if form.is_valid():
            try:
                result = services.plan_what_if(capacity_set=capacity_set, **form.cleaned_data)
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                status = 200
    context = {
        "nav": "capacity_sets",
        "capacity_set": capacity_set,
        "what_if_form": form,
        "what_if": result,
    }
    if result is not None:
        context.update(_what_if_lines(result))
    return render_page(
        request, "plans/what_if_page.html", context, fragment="what-if", status=status
    )


def _what_if_lines(result: services.WhatIf) -> dict:
    mine = [a for a in result.actions if a.subject.startswith(services.WHAT_IF_PREFIX)]
    return {
        "what_if_balances": selectors.pool_balance_rows(result.pools),
        "what_if_blocks": [a for a in mine if a.kind == PlanAction.Kind.PLACEMENT],
        "what_if_reasons": sorted(
            {a.reason for a in mine if a.kind == PlanAction.Kind.UNSATISFIED}
        ),
        "what_if_others": [
            a
            for a in result.actions
            if a.kind == PlanAction.Kind.PREEMPTION
            and not a.for_subject.startswith(services.WHAT_IF_PREFIX)
        ],
    }
