"""A tenant's machines: the whole nodes rented to it as bare metal (docs/bmc.md, "Whole
machines for tenants"), each with its power and its last power action, buttons to switch it
(off and reset confirmed), a re-image from its cluster's catalogue (confirmed) with its
progress, and ending the rental. Operators look in read-only. The BMC's
address and credentials are never on the page: what the tenant reads is its own words
(``gpucap.bmc.bare_metal_power``).

Every answer to an HTMX request is the live part (``tenant_machines.html#machines-live``); a
refused action re-renders it with the reason next to the machine (400 bad input, 409 a state
that forbids it), and nothing changes. A rental of another tenant is a 404, also under one's
own tenant's path.
"""

from collections.abc import Callable

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from gpucap.bmc import bare_metal, bare_metal_power
from gpucap.bmc.bare_metal_selectors import tenant_machines
from gpucap.bmc.models import BareMetalImage, BareMetalRental
from gpucap.errors import Conflict
from gpucap.roles import tenant_change_allowed, tenant_change_check
from gpucap.tenancy import selectors as tenancy
from gpucap.web.pages import render_page, tenant_nav

FRAGMENT = "machines-live"


@require_GET
@login_required
def machines(request: HttpRequest, slug: str) -> HttpResponse:
    """The tenant's machines; the live part polls this URL."""
    tenant = tenancy.tenant_visible_to(user=request.user, slug=slug)
    return _page(request, tenant)


@require_POST
@login_required
def machine_power(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    """Power on, off or reset (``action``), sent to the BMC by a task."""
    action = request.POST.get("action", "")
    return _act(
        request,
        slug,
        pk,
        lambda rental: bare_metal_power.bare_metal_power(
            rental=rental, action=action, actor=request.user
        ),
    )


@require_POST
@login_required
def machine_reimage(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    """Boot the machine from an image of its cluster's catalogue (``image``: its id)."""

    def reimage(rental: BareMetalRental) -> None:
        image = BareMetalImage.objects.filter(
            pk=_whole_number(request.POST.get("image")), cluster_id=rental.node.cluster_id
        ).first()
        if image is None:
            raise ValidationError({"image": "pick an image of the catalogue"})
        bare_metal.bare_metal_reimage(rental=rental, image=image, actor=request.user)

    return _act(request, slug, pk, reimage)


def _whole_number(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() and len(text) < 19 else None


@require_POST
@login_required
def machine_end(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    """End the rental: the machine goes back to the operators."""
    return _act(
        request,
        slug,
        pk,
        lambda rental: bare_metal.bare_metal_end(rental=rental, actor=request.user),
    )


def _act(request: HttpRequest, slug: str, pk: int, act: Callable) -> HttpResponse:
    tenant = tenancy.tenant_visible_to(user=request.user, slug=slug)
    rental = BareMetalRental.objects.filter(pk=pk, tenant=tenant).select_related("node").first()
    if rental is None:
        raise Http404("No such machine.")
    tenant_change_check(request.user, tenant.pk)
    errors, status = {}, 200
    try:
        act(rental)
    except Conflict as exc:
        errors[rental.pk], status = exc.message, 409
    except ValidationError as exc:
        errors[rental.pk], status = "; ".join(exc.messages), 400
    if status == 200 and not request.htmx:
        return redirect("tenant-machines", slug=tenant.slug)
    return _page(request, tenant, errors=errors, status=status)


def _page(request: HttpRequest, tenant, *, errors: dict | None = None, status: int = 200):
    listing = tenant_machines(tenant=tenant)
    for rental in listing.active:
        rental.error = (errors or {}).get(rental.pk, "")
    context = {
        "nav": tenant_nav(request),
        "tenant": tenant,
        "machines": listing,
        "can_change": tenant_change_allowed(request.user, tenant.pk),
    }
    return render_page(
        request, "portal/tenant_machines.html", context, fragment=FRAGMENT, status=status
    )
