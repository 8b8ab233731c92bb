"""Inference pages: a tenant's deployments with the create form, one deployment with its
replicas, settings, API keys and client snippets, and every deployment for operators.

A tenant's pages carry its slug (``/tenants/acme/inference/chat/``), like its VM pages. Members
of the tenant create deployments and keys; operators look at any tenant's deployments and may
change nothing there (``gpucap.roles.tenant_change_check``: 403): a deployment's range, its
keys and a key's secret are the tenant's. Anyone else gets a 404. Views adapt the request and call
selectors or services; the rules live in ``gpucap.inference.services``.
"""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_cache_control
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpucap.inference import selectors, services
from gpucap.inference.forms import ApiKeyForm, DeploymentCreateForm, DeploymentSettingsForm
from gpucap.inference.models import InferenceDeployment
from gpucap.roles import is_operator, tenant_change_allowed, tenant_change_check
from gpucap.tenancy import selectors as tenancy
from gpucap.web.pages import render_page, site_url, tenant_pick, wants_fragment

# HTMX events an action sends so the live parts of its page refresh at once.
DEPLOYMENTS_CHANGED = "deployments-changed"
DEPLOYMENT_CHANGED = "deployment-changed"


def router_url(request: HttpRequest, deployment: InferenceDeployment) -> str:
    """The OpenAI-compatible base URL clients use for a deployment."""
    return request.build_absolute_uri(f"/inference/{deployment.slug}/v1")


# --- every deployment (operators) ---------------------------------------------------------------


@require_GET
@login_required
def deployment_list(request: HttpRequest) -> HttpResponse:
    """Operators: every deployment per pool, with live load. A tenant member: their tenant's
    deployments (a member of several picks the tenant first)."""
    if not is_operator(request.user):
        return tenant_pick(
            request,
            tenancy.tenants_for(request.user),
            url_name="inference:tenant-deployments",
            nav="inference",
            title="Inference",
            things="inference deployments",
            whose="deployments",
            things_long="inference deployments and API keys",
        )
    context = {"nav": "inference", "fleet": selectors.all_deployments()}
    return render_page(
        request, "inference/deployment_list.html", context, fragment="inference-live"
    )


# --- a tenant's deployments ---------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@login_required
def tenant_deployments(request: HttpRequest, slug: str) -> HttpResponse:
    """A tenant's deployments and the form to create one. Operators look in read-only."""
    tenant = tenancy.tenant_visible_to(user=request.user, slug=slug)
    is_member = tenant_change_allowed(request.user, tenant.pk)
    if request.method == "POST":
        tenant_change_check(request.user, tenant.pk)
        return _deployment_create(request, tenant)
    # The live part's poll reads no pools for a form it does not show.
    form = (
        DeploymentCreateForm(tenant=tenant) if is_member and not wants_fragment(request) else None
    )
    context = {**_tenant_context(request, tenant, form), "is_member": is_member}
    return render_page(
        request, "inference/tenant_deployments.html", context, fragment="deployments-live"
    )


def _deployment_create(request: HttpRequest, tenant) -> HttpResponse:
    form = DeploymentCreateForm(request.POST, tenant=tenant)
    if form.is_valid():
        try:
            deployment = services.deployment_create(
                tenant=tenant, actor=request.user, **form.cleaned_data
            )
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            if not request.htmx:
                return redirect(_detail_url(deployment))
            context = _tenant_context(request, tenant, DeploymentCreateForm(tenant=tenant))
            context["created"] = deployment
            response = render_page(
                request,
                "inference/tenant_deployments.html",
                context,
                fragment="deployment-create",
            )
            response["HX-Trigger"] = DEPLOYMENTS_CHANGED
            return response
    context = _tenant_context(request, tenant, form)
    return render_page(
        request,
        "inference/tenant_deployments.html",
        context,
        fragment="deployment-create",
        status=400,
    )


def _tenant_context(request: HttpRequest, tenant, form) -> dict:
    return {
        "nav": "inference",
        "tenant": tenant,
        "listing": selectors.tenant_deployments(tenant=tenant),
        "form": form,
        "is_member": True,
        "site": site_url(request),
    }


# --- one deployment -----------------------------------------------------------------------------


@require_GET
@login_required
def deployment_detail(request: HttpRequest, slug: str, name: str) -> HttpResponse:
    row = selectors.deployment_visible_to(user=request.user, slug=slug, name=name)
    context = _live_context(request, row)
    if not wants_fragment(request):  # the live part's poll reads nothing else
        context.update(_page_context(request, row.deployment))
    return render_page(
        request, "inference/deployment_detail.html", context, fragment="deployment-live"
    )


@require_POST
@login_required
def deployment_update(request: HttpRequest, slug: str, name: str) -> HttpResponse:
    """Change the range or the settings; answers with the refreshed form."""
    row = selectors.deployment_visible_to(user=request.user, slug=slug, name=name)
    deployment = row.deployment
    tenant_change_check(request.user, deployment.tenant_id)
    form = DeploymentSettingsForm(request.POST)
    saved = False
    if form.is_valid():
        try:
            services.deployment_update(
                deployment=deployment, actor=request.user, **form.changes(deployment)
            )
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            if not request.htmx:
                return redirect(_detail_url(deployment))
            form, saved = DeploymentSettingsForm.of(deployment), True
    context = {
        **_live_context(request, row),
        **_page_context(request, deployment),
        "settings_form": form,
        "saved": saved,
    }
    response = render_page(
        request,
        "inference/deployment_detail.html",
        context,
        fragment="deployment-settings",
        status=200 if saved else 400,
    )
    if saved:
        response["HX-Trigger"] = DEPLOYMENT_CHANGED
    return response


@require_POST
@login_required
def key_create(request: HttpRequest, slug: str, name: str) -> HttpResponse:
    """A new API key. The answer is the only time its secret is shown: it is never stored, and
    the answer is marked not to be cached."""
    row = selectors.deployment_visible_to(user=request.user, slug=slug, name=name)
    deployment = row.deployment
    tenant_change_check(request.user, deployment.tenant_id)
    form = ApiKeyForm(request.POST)
    created = secret = None
    if form.is_valid():
        try:
            created, secret = services.api_key_create(
                tenant=deployment.tenant, actor=request.user, **form.service_arguments(deployment)
            )
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            form = ApiKeyForm()
    context = {
        **_live_context(request, row),
        **_page_context(request, deployment),
        "key_form": form,
        "created_key": created,
        "secret": secret,
    }
    response = render_page(
        request,
        "inference/deployment_detail.html",
        context,
        fragment="api-keys",
        status=200 if created else 400,
    )
    patch_cache_control(response, no_store=True, private=True)
    return response


@require_POST
@login_required
def key_revoke(request: HttpRequest, slug: str, name: str, pk: int) -> HttpResponse:
    row = selectors.deployment_visible_to(user=request.user, slug=slug, name=name)
    deployment = row.deployment
    tenant_change_check(request.user, deployment.tenant_id)
    api_key = selectors.deployment_key(deployment=deployment, pk=pk)
    services.api_key_revoke(api_key=api_key, actor=request.user)
    if not request.htmx:
        return redirect(_detail_url(deployment))
    context = {
        **_live_context(request, row),
        **_page_context(request, deployment),
        "revoked_key": api_key,
    }
    return render_page(request, "inference/deployment_detail.html", context, fragment="api-keys")


def _detail_url(deployment: InferenceDeployment) -> str:
    return reverse(
        "inference:deployment-detail",
        kwargs={"slug": deployment.tenant.slug, "name": deployment.name},
    )


def _live_context(request: HttpRequest, row: selectors.DeploymentRow) -> dict:
    replicas = selectors.deployment_replicas(row.deployment)
    for vm in replicas:
        vm.in_flight = row.load.per_replica.get(vm.instance_id, 0) if row.load else None
    return {
        "nav": "inference",
        "row": row,
        "deployment": row.deployment,
        "tenant": row.deployment.tenant,
        "replicas": replicas,
    }


def _page_context(request: HttpRequest, deployment: InferenceDeployment) -> dict:
    is_member = tenant_change_allowed(request.user, deployment.tenant_id)
    return {
        "is_member": is_member,
        "router_url": router_url(request, deployment),
        "settings_form": DeploymentSettingsForm.of(deployment),
        "key_form": ApiKeyForm() if is_member else None,
        "keys": selectors.deployment_keys(deployment),
        "keys_flush_seconds": settings.INFERENCE_KEYS_FLUSH_SECONDS,
        "now": timezone.now(),
    }
