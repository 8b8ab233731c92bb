"""Usage pages: totals, charts and exports for operators and tenants; the billing webhook's
settings and deliveries for operators."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.cache import patch_cache_control
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpucap.fleet.models import CapacitySet
from gpucap.roles import is_operator
from gpucap.tenancy.models import Tenant
from gpucap.tenancy.selectors import tenant_visible_to, tenants_for
from gpucap.usage import charts, export, selectors, services
from gpucap.usage.forms import BillingWebhookForm, UsagePeriodForm, this_month
from gpucap.web.pages import operator_required, render_page, tenant_pick

# --- usage: totals, charts and exports ------------------------------------------------------


@require_GET
@operator_required
def usage_overview(request: HttpRequest) -> HttpResponse:
    """Every tenant's usage in a period (or one tenant's): totals, charts, export links."""
    tenants = list(Tenant.objects.order_by("name"))
    form = UsagePeriodForm(request.GET, tenants=tenants)
    period, tenant = form.period, form.chosen_tenant
    summary = selectors.usage_summary(
        since=period.start, until=period.end, tenant_id=tenant.pk if tenant else None
    )
    query = period.query() | ({"tenant": tenant.slug} if tenant else {})
    context = {
        "nav": "usage",
        "form": form.shown(),
        "period": period,
        "tenant": tenant,
        "summary": summary,
        "kind_chart": charts.usage_by_kind_chart(summary),
        "tenant_chart": None if tenant else charts.usage_by_tenant_chart(summary),
        "query": urlencode(query),
        "period_query": urlencode(period.query()),
    }
    return render_page(
        request,
        "usage/overview.html",
        context,
        fragment="usage-report",
        status=400 if form.errors else 200,
    )


@require_GET
@operator_required
def usage_export(request: HttpRequest, fmt: str) -> HttpResponse:
    """``/usage/export.csv|json?since=&until=[&tenant=]``: every tenant's rows, or one's."""
    form = UsagePeriodForm(
        request.GET, tenants=list(Tenant.objects.order_by("name")), default=this_month
    )
    if not form.is_valid():
        return HttpResponseBadRequest(form.error_text(), content_type="text/plain")
    tenant = form.chosen_tenant
    return export.export_response(fmt, form.period, tenants=None if tenant is None else [tenant])


@require_GET
@login_required
def tenant_usage(request: HttpRequest, slug: str) -> HttpResponse:
    """One tenant's usage, for its members and operators."""
    tenant = tenant_visible_to(user=request.user, slug=slug)
    form = UsagePeriodForm(request.GET)
    period = form.period
    summary = selectors.usage_summary(since=period.start, until=period.end, tenant_id=tenant.pk)
    context = {
        "nav": "usage",
        "form": form.shown(),
        "period": period,
        "tenant": tenant,
        "summary": summary,
        "kind_chart": charts.usage_by_kind_chart(summary),
        "query": urlencode(period.query()),
    }
    return render_page(
        request,
        "usage/tenant_usage.html",
        context,
        fragment="usage-report",
        status=400 if form.errors else 200,
    )


@require_GET
@login_required
def tenant_usage_export(request: HttpRequest, slug: str, fmt: str) -> HttpResponse:
    """A tenant's own rows only, whatever the query says (the form has no tenant field)."""
    tenant = tenant_visible_to(user=request.user, slug=slug)
    form = UsagePeriodForm(request.GET, default=this_month)
    if not form.is_valid():
        return HttpResponseBadRequest(form.error_text(), content_type="text/plain")
    return export.export_response(fmt, form.period, tenants=[tenant])


@require_GET
@login_required
def my_usage(request: HttpRequest) -> HttpResponse:
    """The nav's "My usage": a member of one tenant goes to its usage, of several picks one."""
    if is_operator(request.user):
        return redirect("usage:overview")
    return tenant_pick(
        request,
        tenants_for(request.user),
        url_name="usage:tenant-usage",
        nav="usage",
        title="Usage",
        things="usage",
    )


# The set page's allocation chart: how far back, and how long each bar is.
ALLOCATION_SPANS = {"1": timedelta(hours=1), "7": timedelta(hours=1), "30": timedelta(hours=4)}


@require_GET
@operator_required
def set_allocation(request: HttpRequest, name: str) -> HttpResponse:
    """GPUs held per pool of a capacity set over the last 1, 7 (default) or 30 days: the
    fragment the set page shows in its "GPU allocation" panel when a span is chosen."""
    capacity_set = get_object_or_404(CapacitySet, name=name)
    span = allocation_span(request.GET.get("days", ""))
    context = allocation_context(capacity_set, span=span)
    return render(request, "components/usage_chart_allocation.html", context)


@dataclass(frozen=True)
class AllocationSpan:
    """The steps an allocation chart over ``days`` shows now: whole steps from ``since``, the
    last one (``last_step``) running up to ``now``."""

    days: str
    step: timedelta
    since: datetime
    last_step: datetime
    now: datetime


def allocation_span(days: str) -> AllocationSpan:
    """The span of ``days`` ("1", "7" or "30"; anything else is 7) as of now. No query: a live
    page keys its chart by ``last_step`` (it redraws the chart at least when a new one begins)."""
    if days not in ALLOCATION_SPANS:
        days = "7"
    step = ALLOCATION_SPANS[days]
    now = timezone.now()
    # The step now is in (a step ending exactly now is the last one), and whole steps before.
    last_step = (now - timedelta(microseconds=1)).astimezone(UTC)
    last_step = last_step.replace(minute=0, second=0, microsecond=0)
    last_step -= timedelta(hours=last_step.hour % int(step.total_seconds() // 3600))
    since = last_step - int(timedelta(days=int(days)) / step - 1) * step
    return AllocationSpan(days=days, step=step, since=since, last_step=last_step, now=now)


def allocation_context(capacity_set: CapacitySet, *, span: AllocationSpan) -> dict:
    """The allocation chart of ``capacity_set`` over ``span``. Two queries."""
    held = selectors.gpus_held_per_pool(
        capacity_set=capacity_set, since=span.since, until=span.now, step=span.step, now=span.now
    )
    return {
        "capacity_set": capacity_set,
        "days": span.days,
        "spans": [("1", "24 hours"), ("7", "7 days"), ("30", "30 days")],
        "chart": charts.gpus_held_chart(held),
    }


# --- billing webhook ----------------------------------------------------------------------------

# The HTMX event a change sends so the status part of the billing page refreshes at once.
BILLING_CHANGED = "billing-changed"

SEND_NOW_MESSAGES = {
    services.PushOutcome.NOT_CONFIGURED: "Configure the webhook first.",
    services.PushOutcome.DISABLED: "The webhook is off: switch on “Push usage records” first.",
    services.PushOutcome.BUSY: "Another push is sending a batch right now; try again shortly.",
    services.PushOutcome.IDLE: "Nothing to send: the receiver has accepted every record.",
}


@require_http_methods(["GET", "POST"])
@operator_required
def billing(request: HttpRequest) -> HttpResponse:
    """The billing webhook: settings, state and the latest deliveries (their part refreshes
    itself). POST saves the settings; a new secret is shown in that answer only."""
    status = selectors.billing_status()
    if request.method == "GET":
        form = BillingWebhookForm.of(status.webhook)
        context = {"nav": "usage", "status": status, "form": form}
        return render_page(request, "usage/billing.html", context, fragment="billing-status")
    form = BillingWebhookForm(request.POST)
    secret = None
    if form.is_valid():
        arguments = form.service_arguments()
        try:
            hook = services.billing_webhook_configure(**arguments, actor=request.user)
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            secret = arguments["secret"]
            status = selectors.billing_status()
            form = BillingWebhookForm.of(hook)
    context = {"nav": "usage", "status": status, "form": form, "saved": not form.errors}
    context["secret"] = secret
    response = render_page(
        request,
        "usage/billing.html",
        context,
        fragment="billing-settings",
        status=400 if form.errors else 200,
    )
    patch_cache_control(response, no_store=True, private=True)  # it may carry the secret
    if not form.errors:
        response["HX-Trigger"] = BILLING_CHANGED
    return response


@require_POST
@operator_required
def billing_send(request: HttpRequest) -> HttpResponse:
    """Send now: one push, backoff or not; answers with the refreshed status part."""
    result = services.billing_push(force=True, actor=request.user)
    if not request.htmx:
        return redirect("usage:billing")
    context = {
        "nav": "usage",
        "status": selectors.billing_status(),
        "pushed": result,
        "pushed_message": SEND_NOW_MESSAGES.get(result.outcome, ""),
    }
    refused = result.delivery is None and result.outcome != services.PushOutcome.IDLE
    return render_page(
        request,
        "usage/billing.html",
        context,
        fragment="billing-status",
        status=409 if refused else 200,
    )
