"""Forms of the VM pages. They check the shape of what was typed; the rules (which GPU counts a
fabric allows, which pools a tenant may use, what a name or SSH key looks like) are the
service's, and its errors land next to the fields they name."""

from django import forms

from gpucap.fleet.models import Fabric, Image, Pool
from gpucap.fleet.selectors import images_offered_on
from gpucap.rentals.models import VirtualMachine
from gpucap.rentals.selectors import requestable_pools
from gpucap.tenancy.models import Tenant
from gpucap.vms.selectors import LIVE, VmFilterOptions
from gpucap.web.forms import ServiceErrorsMixin


class PoolChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, pool: Pool) -> str:
        fabric = Fabric(pool.fabric).label
        return f"{pool.name} · {pool.get_kind_display()} · {pool.gpu_model} {fabric}"


class VmRequestForm(ServiceErrorsMixin, forms.Form):
    pool = PoolChoiceField(
        queryset=Pool.objects.none(),
        empty_label=None,
        error_messages={"invalid_choice": "is not a pool your tenant may rent VMs in"},
    )
    name = forms.CharField(
        max_length=63,
        required=False,
        help_text="Lowercase letters, digits and hyphens, e.g. train-01. Leave it empty for a "
        "job: its VMs are named after the job.",
        widget=forms.TextInput(attrs={"placeholder": "train-01", "autocomplete": "off"}),
    )
    job = forms.CharField(
        label="Job (optional)",
        max_length=60,
        required=False,
        help_text="Ask for several VMs of this shape as one job: named <job>-0, <job>-1, ..., "
        "placed all or none, and reclaimed together.",
        widget=forms.TextInput(attrs={"placeholder": "train-7", "autocomplete": "off"}),
    )
    count = forms.IntegerField(
        label="VMs in the job",
        required=False,
        min_value=1,
        max_value=64,
        help_text="1-64; only with a job.",
        widget=forms.NumberInput(attrs={"min": 1, "max": 64, "placeholder": "1"}),
    )
    gpu_count = forms.IntegerField(
        label="GPUs",
        initial=1,
        help_text="PCIe pools: 1. NVSwitch pools: 1, 2, 4 or 8 (one whole NVLink partition).",
        widget=forms.NumberInput(attrs={"min": 1, "max": 8}),
    )
    image = forms.ChoiceField(
        help_text="From the operator's catalogue of the pool's cluster.",
        error_messages={"invalid_choice": "is not an image offered for your pools"},
    )
    ssh_public_key = forms.CharField(
        label="SSH public key",
        help_text="One OpenSSH public key line.",
        widget=forms.Textarea(
            attrs={
                "rows": 3,
                "placeholder": "ssh-ed25519 AAAA... you@laptop",
                "spellcheck": "false",
            }
        ),
    )

    user_data = forms.CharField(
        label="User-data (optional)",
        required=False,
        strip=False,
        help_text="Your own cloud-init user-data (#cloud-config, a script, ...), at most 16 KiB; "
        "run after gpucap installs your SSH key.",
        widget=forms.Textarea(
            attrs={
                "rows": 4,
                "placeholder": "#cloud-config\npackages: [htop]",
                "spellcheck": "false",
            }
        ),
    )

    def __init__(self, data=None, *, tenant: Tenant) -> None:
        super().__init__(data)
        pool = self.fields["pool"]
        pool.queryset = requestable_pools(tenant=tenant)
        # Read the pools once: the page both asks whether there are any and lists them.
        self.pools = list(pool.queryset)
        pool.widget.choices = [(p.pk, pool.label_from_instance(p)) for p in self.pools]
        self.images = images_offered_on(cluster_ids={p.cluster_id for p in self.pools})
        self.fields["image"].choices = _image_choices(self.images)
        self.fields["image"].initial = _vm_image(self.images)


def _image_choices(images: list[Image]) -> list:
    """One option per image name (the service checks it against the chosen pool's cluster),
    grouped by cluster when the tenant's pools span several."""
    by_cluster: dict[str, list[tuple[str, str]]] = {}
    for image in images:
        by_cluster.setdefault(image.cluster.name, []).append((image.name, _image_label(image)))
    if len(by_cluster) == 1:
        return next(iter(by_cluster.values()))
    return [(f"cluster {cluster}", choices) for cluster, choices in by_cluster.items()]


def _vm_image(images: list[Image]) -> str | None:
    """The image a VM form starts on: the first meant for a VM. Replica images (those that
    serve ports, such as gpucap-model-server) are for inference deployments, and would
    otherwise come first by name."""
    for image in images:
        if not image.ports:
            return image.name
    return None


def _image_label(image: Image) -> str:
    about = f" — {image.description}" if image.description else ""
    return f"{image.name}{about} (log in as {image.default_user})"


class VmFilterForm(forms.Form):
    """The operator list's filters. Choices come from the data, so a stale link that names a
    tenant or pool that no longer exists says so instead of silently showing everything."""

    tenant = forms.ChoiceField(required=False)
    pool = forms.ChoiceField(required=False)
    state = forms.ChoiceField(required=False)
    node = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    job = forms.CharField(required=False, max_length=60)

    def __init__(self, data, *, options: VmFilterOptions) -> None:
        super().__init__(data)
        self.fields["tenant"].choices = [("", "All tenants"), *options.tenants]
        self.fields["pool"].choices = [("", "All pools"), *[(p, p) for p in options.pools]]
        self.fields["state"].choices = [
            (LIVE, "Any but terminated"),
            *VirtualMachine.State.choices,
        ]
        self.fields["node"].choices = [("", "All nodes"), *options.nodes]

    def filters(self) -> dict:
        """The valid filters; an invalid one is dropped (and reported through ``errors``)."""
        self.is_valid()
        return {name: value for name, value in self.cleaned_data.items() if value not in ("", None)}
