"""What every page view shares: who may open it, and whether it answers with the whole page or
only the fragment an HTMX request asked for."""

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers

from gpucap.tenancy.roles import is_operator


def operator_required(view: Callable) -> Callable:
    """Anonymous users go to the login page; signed-in users who are not operators get 403."""

    @wraps(view)
    @login_required
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not is_operator(request.user):
            raise PermissionDenied("This page is for operators.")
        return view(request, *args, **kwargs)

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
