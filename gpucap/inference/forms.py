"""Forms of the inference pages. They check the shape of what was typed; the rules (ranges,
GPU counts a fabric allows, pools a tenant may use, names) are the services', and a service's
errors land next to the fields they name."""

import datetime

from django import forms

from gpucap.fleet.models import Fabric, Pool
from gpucap.fleet.selectors import images_offered_on
from gpucap.inference import selectors
from gpucap.inference.models import InferenceDeployment
from gpucap.inference.services import REPLICA_IMAGE
from gpucap.tenancy.models import Tenant
from gpucap.web.forms import ServiceErrorsMixin

_model = InferenceDeployment._meta


def _count(name: str, label: str, help_text: str = "", *, minimum: int = 0) -> forms.IntegerField:
    """A whole-number field with the model's default as its initial value."""
    return forms.IntegerField(
        label=label,
        initial=_model.get_field(name).default,
        help_text=help_text or _model.get_field(name).help_text,
        widget=forms.NumberInput(attrs={"min": minimum}),
    )


class DeploymentSettingsForm(ServiceErrorsMixin, forms.Form):
    """The range and the router's and autoscaler's settings: shared by create and edit."""

    min_replicas = _count("min_replicas", "Min replicas", "Never fewer, even when idle.")
    max_replicas = _count("max_replicas", "Max replicas", "Never more, however long the queue.")
    target_in_flight = _count("target_in_flight", "Target in flight per replica", minimum=1)
    replica_concurrency = _count("replica_concurrency", "Replica concurrency", minimum=1)
    queue_limit = _count("queue_limit", "Queue limit")
    scale_down_cooldown_seconds = _count(
        "scale_down_cooldown_seconds",
        "Scale-down cool-down (s)",
        "How long fewer replicas must do before one is stopped.",
    )
    cold_start_timeout_seconds = _count(
        "cold_start_timeout_seconds",
        "Cold-start timeout (s)",
        "How long a request waits for a replica to start when none is ready.",
        minimum=1,
    )

    SETTINGS = (
        "min_replicas",
        "max_replicas",
        "target_in_flight",
        "replica_concurrency",
        "queue_limit",
        "scale_down_cooldown_seconds",
        "cold_start_timeout_seconds",
    )

    def changes(self, deployment: InferenceDeployment) -> dict[str, int]:
        """The settings that differ from the deployment's."""
        return {
            name: value
            for name, value in self.cleaned_data.items()
            if name in self.SETTINGS and getattr(deployment, name) != value
        }

    @classmethod
    def of(cls, deployment: InferenceDeployment) -> "DeploymentSettingsForm":
        return cls(initial={name: getattr(deployment, name) for name in cls.SETTINGS})


class PoolChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, pool: Pool) -> str:
        where = pool.capacity_set.name if pool.capacity_set_id else "standalone"
        return f"{pool.name} · {pool.gpu_model} {Fabric(pool.fabric).label} · {where}"


class DeploymentCreateForm(DeploymentSettingsForm):
    # The router path is derived from the name: a taken path is the name's problem.
    error_fields = {"slug": "name"}

    name = forms.CharField(
        max_length=63,
        help_text="Lowercase letters, digits and hyphens, e.g. chat. Part of the router's URL.",
        widget=forms.TextInput(attrs={"placeholder": "chat", "autocomplete": "off"}),
    )
    model_name = forms.CharField(
        label="Model",
        max_length=200,
        help_text="The model id clients ask for.",
        widget=forms.TextInput(
            attrs={"placeholder": "meta-llama/Llama-3.1-8B-Instruct", "autocomplete": "off"}
        ),
    )
    pool = PoolChoiceField(
        label="Inference pool",
        queryset=Pool.objects.none(),
        empty_label=None,
        error_messages={"invalid_choice": "is not an inference pool your tenant may use"},
    )
    image = forms.ChoiceField(
        label="Replica image",
        required=False,
        help_text="From the operator's catalogue: what each replica boots and serves.",
        error_messages={"invalid_choice": "is not a replica image offered for your pools"},
    )
    gpus_per_replica = forms.IntegerField(
        label="GPUs per replica",
        initial=1,
        help_text="PCIe pools: 1. NVSwitch pools: 1, 2, 4 or 8 (one whole NVLink partition).",
        widget=forms.NumberInput(attrs={"min": 1, "max": 8}),
    )

    field_order = [
        "name",
        "model_name",
        "pool",
        "image",
        "gpus_per_replica",
        *DeploymentSettingsForm.SETTINGS,
    ]

    def __init__(self, data=None, *, tenant: Tenant) -> None:
        super().__init__(data)
        pool = self.fields["pool"]
        pool.queryset = selectors.inference_pools(tenant=tenant)
        # Read the pools once: the page both asks whether there are any and lists them.
        self.pools = list(pool.queryset)
        pool.widget.choices = [(p.pk, pool.label_from_instance(p)) for p in self.pools]
        images = images_offered_on(cluster_ids={p.cluster_id for p in self.pools})
        # One option per name; the service checks it against the chosen pool's cluster.
        names = dict.fromkeys(image.name for image in images if image.ports)
        self.fields["image"].choices = [(name, name) for name in names]
        if REPLICA_IMAGE in names:
            self.fields["image"].initial = REPLICA_IMAGE

    def clean_image(self) -> str:
        return self.cleaned_data["image"] or REPLICA_IMAGE


class ApiKeyForm(ServiceErrorsMixin, forms.Form):
    DEPLOYMENT, TENANT = "deployment", "tenant"

    name = forms.CharField(
        max_length=100,
        help_text="What the key is for, e.g. production chatbot.",
        widget=forms.TextInput(attrs={"placeholder": "production chatbot", "autocomplete": "off"}),
    )
    scope = forms.ChoiceField(
        label="Opens",
        choices=[(DEPLOYMENT, "This deployment only"), (TENANT, "All my tenant's deployments")],
        initial=DEPLOYMENT,
        widget=forms.RadioSelect,
    )
    expires_on = forms.DateField(
        label="Expires on",
        required=False,
        help_text="Optional. The key stops working at 00:00 UTC that day.",
        widget=forms.DateInput(attrs={"type": "date"}),
        error_messages={"invalid": "is not a date (YYYY-MM-DD)"},
    )
    error_fields = {"deployment": "scope", "expires_at": "expires_on"}

    def service_arguments(self, deployment: InferenceDeployment) -> dict:
        expires = self.cleaned_data["expires_on"]
        return {
            "name": self.cleaned_data["name"],
            "deployment": deployment if self.cleaned_data["scope"] == self.DEPLOYMENT else None,
            "expires_at": (
                datetime.datetime.combine(expires, datetime.time(), tzinfo=datetime.UTC)
                if expires
                else None
            ),
        }
