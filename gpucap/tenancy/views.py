"""Where people land: operators on the fleet, tenant members on their tenant's page."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from gpucap.tenancy import selectors
from gpucap.tenancy.decorators import render_page
from gpucap.tenancy.roles import is_operator


@require_GET
@login_required
def home(request: HttpRequest) -> HttpResponse:
    """Operators go to the fleet; a member of one tenant to its page; a member of several
    picks one; someone with no tenant yet is told whom to ask."""
    if is_operator(request.user):
        return redirect("fleet:overview")
    tenants = selectors.tenants_for(request.user)
    if len(tenants) == 1:
        return redirect("tenant-detail", slug=tenants[0].slug)
    return render(request, "tenancy/home.html", {"nav": "tenant", "tenants": tenants})


@require_GET
@login_required
def tenant_detail(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = selectors.tenant_visible_to(user=request.user, slug=slug)
    overview = selectors.tenant_overview(tenant=tenant, user=request.user)
    context = {"nav": "tenant", "overview": overview}
    return render_page(request, "tenancy/tenant_detail.html", context, fragment="tenant-pools")
