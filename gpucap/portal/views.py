"""Where people land, a tenant's portal, and the operators' list of tenants: the pages that
combine the apps around a tenant.

Operators land on the fleet, tenant members on their tenant's portal. Operators may open any
tenant's portal read-only: it renders without its forms. A tenant that is not yours is a 404,
as if it did not exist.
"""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET

from gpucap.portal import attention, selectors
from gpucap.roles import is_operator
from gpucap.tenancy import selectors as tenancy
from gpucap.web.pages import operator_required, render_page, site_url, tenant_nav, wants_fragment


@require_GET
@login_required
def home(request: HttpRequest) -> HttpResponse:
    """Operators see what needs their attention first; a member of one tenant goes to its
    page; a member of several picks one; someone with no tenant yet is told whom to ask."""
    if is_operator(request.user):
        context = {"nav": "home", "attention": attention.attention()}
        return render_page(request, "portal/operator_home.html", context, fragment="attention")
    tenants = tenancy.tenants_for(request.user)
    if len(tenants) == 1:
        return redirect("tenant-detail", slug=tenants[0].slug)
    return render(request, "portal/home.html", {"nav": "tenant", "tenants": tenants})


@require_GET
@operator_required
def tenant_list(request: HttpRequest) -> HttpResponse:
    """Operators: every tenant with what it runs, each linking to its portal."""
    return render(
        request, "portal/tenant_list.html", {"nav": "tenants", "tenants": selectors.tenant_list()}
    )


# --- the portal -------------------------------------------------------------------------------


@require_GET
@login_required
def tenant_detail(request: HttpRequest, slug: str) -> HttpResponse:
    """The tenant's portal. Its live part (VMs, deployments, this month's GPU-hours) polls this
    URL and reads nothing else."""
    tenant = tenancy.tenant_visible_to(user=request.user, slug=slug)
    now = timezone.now()
    context = {"nav": tenant_nav(request), "tenant": tenant, "site": site_url(request), "now": now}
    context["keys_flush_seconds"] = settings.INFERENCE_KEYS_FLUSH_SECONDS
    if wants_fragment(request):
        context["live"] = selectors.portal_live(tenant=tenant, now=now)
    else:
        portal = selectors.tenant_portal(tenant=tenant, user=request.user, now=now)
        context.update(portal=portal, live=portal.live, read_only=portal.read_only)
    return render_page(request, "portal/tenant_detail.html", context, fragment="portal-live")
