"""The Reservations section of a capacity set's page (#19): each reservation of the set with
what it is now (in force, held by its tenant, kept, who borrows it and what its tenant's claim
would reclaim, by the set's latest plan: `gpucap.plans.reservations.reservation_facts`, as the
API shows them), the form that previews a new one (changing nothing) and then approves it,
and Remove.

Every rule is the services' (`gpucap.allocation.reservations`): the form only gathers what
was written, and a refusal lands next to the field it names, with a 400 and nothing stored.
Under HTMX each answer is the section alone; a write also sends ``HX-Trigger: set-changed``
so the page's live regions follow at once.
"""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_GET, require_POST

from gpucap.allocation import services as allocation
from gpucap.allocation.models import Reservation
from gpucap.arbiter.topology import block_sizes
from gpucap.console.schedule import DAYS, ZONES
from gpucap.fleet.models import CapacitySet
from gpucap.plans.reservations import reservation_facts, reservation_preview
from gpucap.plans.views import SET_CHANGED
from gpucap.tenancy.models import Tenant
from gpucap.web.forms import ServiceErrorsMixin
from gpucap.web.pages import operator_required, render_page, wants_fragment

TEMPLATE = "console/set_reservations.html"
FRAGMENT = "set-reservations"
WHEN = (("always", "Always"), ("window", "During a weekly window"))


class ReservationForm(ServiceErrorsMixin, forms.Form):
    """A reservation as the set page writes it; `reservation_check` judges it."""

    # The services name the choice between always and a window "always".
    error_fields = {"always": "when"}

    tenant = forms.ModelChoiceField(
        label="Tenant",
        queryset=Tenant.objects.order_by("slug"),
        to_field_name="slug",
        empty_label="Pick a tenant",
        error_messages={"required": "pick the tenant the GPUs are kept for"},
    )
    name = forms.CharField(label="Name", max_length=64, help_text="e.g. acme-training")
    gpus = forms.IntegerField(label="GPUs", help_text="Kept for the tenant: whole blocks.")
    block_gpus = forms.TypedChoiceField(
        label="In blocks of", coerce=int, help_text="Each block is kept on one NVLink partition."
    )
    when = forms.ChoiceField(
        label="In force", choices=WHEN, initial="always", widget=forms.RadioSelect
    )
    days = forms.TypedMultipleChoiceField(
        label="Days it starts on",
        choices=DAYS,
        coerce=int,
        required=False,
        widget=forms.CheckboxSelectMultiple,
    )
    start = forms.CharField(
        label="From", required=False, widget=forms.TimeInput(attrs={"type": "time"})
    )
    end = forms.CharField(
        label="Until",
        required=False,
        widget=forms.TimeInput(attrs={"type": "time"}),
        help_text="At or before the start: the window ends the next day.",
    )
    time_zone = forms.CharField(
        label="Time zone",
        required=False,
        initial="UTC",
        widget=forms.TextInput(attrs={"list": "reservation-zones", "autocomplete": "off"}),
    )

    def __init__(self, data=None, *, capacity_set: CapacitySet) -> None:
        # Its own ids: the set page holds the schedule's form too, with fields of these names.
        super().__init__(data, auto_id="reservation_%s")
        sizes = block_sizes(capacity_set.fabric)
        self.fields["block_gpus"].choices = [(size, f"{size} GPUs") for size in sizes]
        self.fields["block_gpus"].initial = sizes[-1]

    def written(self) -> dict:
        """The reservation in its written form (the API's and the fleet file's)."""
        data = self.cleaned_data
        written = {key: data[key] for key in ("name", "gpus", "block_gpus")}
        if data["when"] == "always":
            return {**written, "always": True}
        window = {key: data[key] for key in ("days", "start", "end", "time_zone")}
        return {**written, "always": False, **window}


def reservations_context(
    capacity_set: CapacitySet, *, form: ReservationForm | None = None, **extra
) -> dict:
    """What the section shows: the set's reservations with their facts (five queries, whatever
    their number; one more when a claim would reclaim VMs) and the form."""
    rows = list(
        Reservation.objects.filter(capacity_set=capacity_set)
        .select_related("tenant")
        .order_by("name")
    )
    facts = reservation_facts(rows)
    return {
        "capacity_set": capacity_set,
        "reservations": [(row, facts[row.pk]) for row in rows],
        "reservation_form": form or ReservationForm(capacity_set=capacity_set),
        "zones": ZONES,
        **extra,
    }


@require_GET
@operator_required
def reservations_section(request: HttpRequest, name: str) -> HttpResponse:
    """The set page's Reservations section (loaded after the page), or a page of its own."""
    return _answer(request, _capacity_set(name))


@require_POST
@operator_required
def reservation_add(request: HttpRequest, name: str) -> HttpResponse:
    """Without ``approve``: the preview (who would borrow and get notices when the tenant
    claims it), nothing stored. With it: create the reservation."""
    capacity_set = _capacity_set(name)
    form = ReservationForm(request.POST, capacity_set=capacity_set)
    if not form.is_valid():
        return _answer(request, capacity_set, form=form, status=400)
    tenant, data = form.cleaned_data["tenant"], form.written()
    try:
        if "approve" not in request.POST:
            preview = reservation_preview(tenant=tenant, capacity_set=capacity_set, data=data)
            return _answer(
                request, capacity_set, form=form, preview=preview, approve=_resent(request)
            )
        row = allocation.reservation_create(
            tenant=tenant, capacity_set=capacity_set, data=data, actor=request.user
        )
    except ValidationError as exc:
        form.add_service_errors(exc)
        return _answer(request, capacity_set, form=form, status=400)
    done = f"Reserved {row.gpus} GPUs of {capacity_set.name} for {tenant.slug} ({row.name})."
    return _answer(request, capacity_set, done=done, changed=True)


@require_POST
@operator_required
def reservation_delete(request: HttpRequest, name: str, pk: int) -> HttpResponse:
    capacity_set = _capacity_set(name)
    row = get_object_or_404(
        Reservation.objects.select_related("tenant", "capacity_set"),
        capacity_set=capacity_set,
        pk=pk,
    )
    words = f"Removed {row.tenant.slug}'s reservation {row.name}: nothing is kept for it now."
    allocation.reservation_delete(reservation=row, actor=request.user)
    return _answer(request, capacity_set, done=words, changed=True)


def _capacity_set(name: str) -> CapacitySet:
    return get_object_or_404(CapacitySet, name=name)


def _resent(request: HttpRequest) -> list[tuple[str, str]]:
    """The form's fields as written, for the Approve button to send again unchanged."""
    return [
        (key, value)
        for key, values in request.POST.lists()
        if key not in ("csrfmiddlewaretoken", "approve")
        for value in values
    ]


def _answer(
    request: HttpRequest,
    capacity_set: CapacitySet,
    *,
    form: ReservationForm | None = None,
    status: int = 200,
    changed: bool = False,
    **extra,
) -> HttpResponse:
    """The section under HTMX (with the page's event after a write); without JavaScript, the
    set page after a write, or the section on a page of its own."""
    if changed and not wants_fragment(request):
        return redirect("fleet:capacity-set-detail", name=capacity_set.name)
    context = {"nav": "capacity_sets", **reservations_context(capacity_set, form=form, **extra)}
    response = render_page(request, TEMPLATE, context, fragment=FRAGMENT, status=status)
    if changed:
        response["HX-Trigger"] = SET_CHANGED
    return response
