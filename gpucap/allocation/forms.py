"""The quotas page's form: what it means is the services' to say (``quota_problems``), next to
the field it names."""

from django import forms

from gpucap.fleet.models import Pool
from gpucap.tenancy.models import Tenant
from gpucap.web.forms import ServiceErrorsMixin


class QuotaForm(ServiceErrorsMixin, forms.Form):
    tenant = forms.ModelChoiceField(
        label="Tenant", queryset=Tenant.objects.order_by("slug"), to_field_name="slug"
    )
    pool = forms.ModelChoiceField(
        label="Pool",
        queryset=Pool.objects.order_by("name"),
        to_field_name="name",
        required=False,
        help_text="The quota binds this pool…",
    )
    gpu_model = forms.CharField(
        label="or GPU model",
        required=False,
        max_length=64,
        help_text="…or every pool of this GPU model, in every set.",
    )
    max_gpus = forms.IntegerField(
        label="Most GPUs", help_text="Held plus pending; new requests past it are refused."
    )
    max_pending = forms.IntegerField(
        label="Most pending requests", required=False, help_text="Empty: no limit."
    )
