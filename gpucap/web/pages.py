"""What every page view shares: who may open it, and whether it answers with the whole page or
only the fragment an HTMX request asked for."""

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.cache import patch_vary_headers

from gpucap.roles import is_operator


def operator_required(view: Callable) -> Callable:
    """Anonymous users go to the login page; signed-in users who are not operators get 403."""

    @wraps(view)
    @login_required
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not is_operator(request.user):
            raise PermissionDenied("This page is for operators.")
        return view(request, *args, **kwargs)

    # Read by the test that walks every tenant-side route (operators' own pages are not).
    wrapped.operator_only = True
    return wrapped


def wants_fragment(request: HttpRequest) -> bool:
    """An HTMX swap wants one fragment; a boosted link or a history restore wants the page."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.boosted and not htmx.history_restore_request


def render_page(
    request: HttpRequest, template_name: str, context: dict, *, fragment: str, status: int = 200
) -> HttpResponse:
    """Render ``template_name``, or only its ``{% partialdef fragment %}`` for an HTMX swap."""
    name = f"{template_name}#{fragment}" if wants_fragment(request) else template_name
    response = render(request, name, context, status=status)
    # The same URL answers with a page or a fragment: caches must keep them apart.
    patch_vary_headers(response, ("HX-Request",))
    return response


def tenant_pick(
    request: HttpRequest,
    tenants: list,
    *,
    url_name: str,
    nav: str,
    title: str,
    things: str,
    whose: str = "",
    things_long: str = "",
) -> HttpResponse:
    """Where a tenant member lands on a page that is per tenant: a member of one tenant goes to
    its page (``url_name`` by slug), of several picks one, of none is told whom to ask."""
    if len(tenants) == 1:
        return redirect(url_name, slug=tenants[0].slug)
    context = {
        "nav": nav,
        "tenants": tenants,
        "title": title,
        "things": things,
        "whose": whose,
        "things_long": things_long,
        "url_name": url_name,
    }
    return render(request, "components/pick_tenant.html", context)


def site_url(request: HttpRequest) -> str:
    """The origin this request reached, for absolute links (``https://gpucap.example.com``)."""
    return request.build_absolute_uri("/").rstrip("/")


def tenant_nav(request: HttpRequest) -> str:
    """Which menu item a tenant's page lights: an operator came from "Tenants"."""
    return "tenants" if is_operator(request.user) else "tenant"
