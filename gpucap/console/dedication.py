"""The node page's dedication panel: pick a tenant, Preview (who gets notices, who holds the
node up), then Apply; Release a dedicated node. Each answers an HTMX request with the panel
alone (``node_detail.html#node-dedication``); bad input re-renders it in place with a 400, a
state that forbids the change with a 409, and nothing changes."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from gpucap.console.node_page import DedicateForm, node_context
from gpucap.errors import Conflict
from gpucap.fleet import selectors
from gpucap.notices import dedications
from gpucap.web.pages import operator_required, render_page

FRAGMENT = "node-dedication"


@require_POST
@operator_required
def node_dedicate(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    """``apply`` absent: a preview, nothing changes; present: dedicate and send the notices."""
    node = selectors.node_with_gpus(cluster=cluster, hostname=hostname).node
    form = DedicateForm(request.POST)
    context, status = {}, 200
    if not form.is_valid():
        status = 400
    else:
        tenant = form.cleaned_data["tenant"]
        try:
            if "apply" in request.POST:
                context["applied"] = dedications.node_dedicate(
                    node=node, tenant=tenant, actor=request.user
                )
            else:
                context["preview"] = dedications.node_dedicate_preview(node=node, tenant=tenant)
        except Conflict as exc:
            context["dedication_error"], status = exc.message, 409
    return _answer(request, cluster, hostname, context, form=form, status=status)


@require_POST
@operator_required
def node_release(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    node = selectors.node_with_gpus(cluster=cluster, hostname=hostname).node
    context, status = {}, 200
    try:
        dedications.node_release(node=node, actor=request.user)
        context["released"] = True
    except Conflict as exc:
        context["dedication_error"], status = exc.message, 409
    return _answer(request, cluster, hostname, context, status=status)


def _answer(request, cluster, hostname, context, *, form=None, status=200) -> HttpResponse:
    if status == 200 and not request.htmx and "preview" not in context:
        return redirect("fleet:node-detail", cluster=cluster, hostname=hostname)
    tile = selectors.node_with_gpus(cluster=cluster, hostname=hostname)
    keep = form if status != 200 or "preview" in context else None
    full = {**node_context(tile, dedicate_form=keep), **context}
    return render_page(request, "console/node_detail.html", full, fragment=FRAGMENT, status=status)
