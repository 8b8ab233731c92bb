"""The operators' side of whole machines rented to tenants (docs/bmc.md, "Whole machines for
tenants"), in two sections loaded after their pages:

- the node page's **Bare metal** section (``console/node_bare_metal.html``): a node dedicated
  to a tenant is rented to it whole (an image of the cluster's catalogue it is handed over with,
  optional), a rental under way shows its power and last power action with the BMC's own words
  when it failed, and is ended (confirmed);
- the cluster page's **Bare-metal images** section (``console/cluster_bare_metal_images.html``):
  the catalogue tenants re-image their machines from; add, offer or withdraw, remove.

Every rule is the services' (``gpucap.bmc.bare_metal``, ``gpucap.bmc.bare_metal_images``): a
refusal re-renders the section with the reason (400 bad input next to its field, 409 a state
that forbids it), and nothing changes. Under HTMX each answer is the section alone.
"""

from django import forms
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_GET, require_POST

from gpucap.bmc import bare_metal, bare_metal_images
from gpucap.bmc.bare_metal_selectors import with_power
from gpucap.bmc.models import BareMetalImage, BareMetalRental
from gpucap.errors import Conflict
from gpucap.fleet.models import Cluster, Node
from gpucap.web.forms import ServiceErrorsMixin
from gpucap.web.pages import operator_required, render_page, wants_fragment

NODE_TEMPLATE, NODE_FRAGMENT = "console/node_bare_metal.html", "node-bare-metal"
IMAGES_TEMPLATE, IMAGES_FRAGMENT = "console/cluster_bare_metal_images.html", "bare-metal-images"
ENDED_SHOWN = 3


# --- a node's rental ------------------------------------------------------------------------------


class RentForm(forms.Form):
    image = forms.ModelChoiceField(
        queryset=BareMetalImage.objects.none(),
        required=False,
        empty_label="As it is (none of the catalogue)",
        help_text="What the machine is handed over with.",
    )

    def __init__(self, *args, node: Node, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["image"].queryset = BareMetalImage.objects.filter(
            cluster_id=node.cluster_id, enabled=True
        )


@require_GET
@operator_required
def node_section(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    node = _node(cluster, hostname)
    return _node_answer(request, node)


@require_POST
@operator_required
def node_rent(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    node = _node(cluster, hostname)
    form = RentForm(request.POST, node=node)
    if not form.is_valid():
        return _node_answer(request, node, form=form, status=400)
    if node.dedicated_tenant is None:
        error = f"node {node.hostname} is shared: dedicate it to a tenant to rent it whole"
        return _node_answer(request, node, form=form, error=error, status=409)
    try:
        bare_metal.bare_metal_rent(
            node=node,
            tenant=node.dedicated_tenant,
            image=form.cleaned_data["image"],
            actor=request.user,
        )
    except Conflict as exc:
        return _node_answer(request, node, form=form, error=exc.message, status=409)
    except ValidationError as exc:
        return _node_answer(request, node, form=form, error="; ".join(exc.messages), status=400)
    return _node_answer(request, node, changed=True)


@require_POST
@operator_required
def node_rental_end(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    node = _node(cluster, hostname)
    rental = BareMetalRental.objects.filter(node=node, ended_at=None).first()
    if rental is None:
        error = f"node {node.hostname} is not rented: nothing to end"
        return _node_answer(request, node, error=error, status=409)
    bare_metal.bare_metal_end(rental=rental, actor=request.user)
    return _node_answer(request, node, changed=True)


def _node(cluster: str, hostname: str) -> Node:
    return get_object_or_404(
        Node.objects.select_related("cluster", "dedicated_tenant"),
        cluster__name=cluster,
        hostname=hostname,
    )


def _node_answer(
    request: HttpRequest,
    node: Node,
    *,
    form: RentForm | None = None,
    error: str = "",
    status: int = 200,
    changed: bool = False,
) -> HttpResponse:
    """The section (under HTMX), the node page after a change without JavaScript, or the
    section on a page of its own. Four queries."""
    if changed and not wants_fragment(request):
        return redirect("fleet:node-detail", cluster=node.cluster.name, hostname=node.hostname)
    node = _node(node.cluster.name, node.hostname)  # as it is now
    rentals = list(
        BareMetalRental.objects.filter(node=node)
        .select_related("tenant", "image", "started_by", "ended_by")
        .order_by("-started_at", "-id")[: ENDED_SHOWN + 1]
    )
    current = next((rental for rental in rentals if rental.active), None)
    if current is not None:
        with_power([current])
    context = {
        "nav": "fleet",
        "node": node,
        "rental": current,
        "ended": [rental for rental in rentals if not rental.active][:ENDED_SHOWN],
        "rent_form": form or RentForm(node=node),
        "error": error,
    }
    return render_page(request, NODE_TEMPLATE, context, fragment=NODE_FRAGMENT, status=status)


# --- a cluster's catalogue ------------------------------------------------------------------------


class ImageForm(ServiceErrorsMixin, forms.Form):
    name = forms.CharField(max_length=64, help_text="What tenants choose, e.g. ubuntu-24.04-server")
    image_url = forms.CharField(
        label="Image URL",
        max_length=500,
        help_text="The http(s) URL of the installer or OS image (an ISO) the BMC boots from.",
    )
    description = forms.CharField(required=False, max_length=2000)


@require_GET
@operator_required
def images_section(request: HttpRequest, name: str) -> HttpResponse:
    return _images_answer(request, _cluster(name))


@require_POST
@operator_required
def image_add(request: HttpRequest, name: str) -> HttpResponse:
    cluster = _cluster(name)
    form = ImageForm(request.POST)
    if form.is_valid():
        try:
            image = bare_metal_images.bare_metal_image_create(
                cluster=cluster, actor=request.user, **form.cleaned_data
            )
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            done = f"Added {image.name}: tenants renting machines of {cluster.name} may choose it."
            return _images_answer(request, cluster, done=done, changed=True)
    return _images_answer(request, cluster, form=form, status=400)


@require_POST
@operator_required
def image_offer(request: HttpRequest, name: str, pk: int) -> HttpResponse:
    """``enabled`` "1" offers the image to tenants, anything else withdraws it."""
    cluster = _cluster(name)
    image = get_object_or_404(BareMetalImage, cluster=cluster, pk=pk)
    enabled = request.POST.get("enabled") == "1"
    bare_metal_images.bare_metal_image_update(image=image, enabled=enabled, actor=request.user)
    done = f"{image.name} is {'offered to' if enabled else 'withdrawn from'} tenants."
    return _images_answer(request, cluster, done=done, changed=True)


@require_POST
@operator_required
def image_delete(request: HttpRequest, name: str, pk: int) -> HttpResponse:
    cluster = _cluster(name)
    image = get_object_or_404(BareMetalImage, cluster=cluster, pk=pk)
    try:
        bare_metal_images.bare_metal_image_delete(image=image, actor=request.user)
    except Conflict as exc:
        return _images_answer(request, cluster, error=exc.message, status=409)
    return _images_answer(request, cluster, done=f"Removed {image.name}.", changed=True)


def _cluster(name: str) -> Cluster:
    return get_object_or_404(Cluster, name=name)


def _images_answer(
    request: HttpRequest,
    cluster: Cluster,
    *,
    form: ImageForm | None = None,
    status: int = 200,
    changed: bool = False,
    **extra,
) -> HttpResponse:
    if changed and not wants_fragment(request):
        return redirect("fleet:cluster-detail", name=cluster.name)
    context = {
        "nav": "fleet",
        "cluster": cluster,
        "images": list(BareMetalImage.objects.filter(cluster=cluster).order_by("name")),
        "image_form": form or ImageForm(),
        **extra,
    }
    return render_page(request, IMAGES_TEMPLATE, context, fragment=IMAGES_FRAGMENT, status=status)
