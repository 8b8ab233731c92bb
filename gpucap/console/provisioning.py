"""The node page's provisioning panel (``console/node_provisioning.html``): the image URL form,
the newest run's steps with their times, polled while it runs, and what happened. GET answers
an HTMX poll with the panel alone; POST starts a run: bad input re-renders the panel with a
400 and the error next to the field, a node that may not be provisioned now a 409 saying why,
and nothing changes."""

from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_http_methods

from gpucap.bmc import provisioning
from gpucap.console.node_page import node_context
from gpucap.console.provisioning_panel import PANEL, ProvisionForm, provisioning_context
from gpucap.errors import Conflict
from gpucap.fleet import selectors
from gpucap.web.pages import operator_required, wants_fragment


@require_http_methods(["GET", "POST"])
@operator_required
def node_provisioning(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    tile = selectors.node_with_gpus(cluster=cluster, hostname=hostname)
    node = tile.node
    if request.method == "GET":
        if not wants_fragment(request):
            return redirect("fleet:node-detail", cluster=cluster, hostname=hostname)
        return _answer(request, tile, {})
    form = ProvisionForm(request.POST)
    context, status = {}, 200
    if form.is_valid():
        try:
            provisioning.provisioning_start(
                node=node, image_url=form.cleaned_data["image_url"], actor=request.user
            )
        except ValidationError as error:
            form.add_service_errors(error)
            status = 400
        except Conflict as error:
            context["provisioning_error"], status = error.message, 409
    else:
        status = 400
    if status == 200 and not wants_fragment(request):
        return redirect("fleet:node-detail", cluster=cluster, hostname=hostname)
    return _answer(request, tile, context, form=form if status != 200 else None, status=status)


def _answer(request, tile, context, *, form=None, status=200) -> HttpResponse:
    if wants_fragment(request):
        full = {"node": tile.node, **provisioning_context(tile.node, form=form), **context}
        response = render(request, PANEL, full, status=status)
    else:
        full = {**node_context(tile), **provisioning_context(tile.node, form=form), **context}
        response = render(request, "console/node_detail.html", full, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response
