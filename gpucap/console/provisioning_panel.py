"""What the node page's provisioning panel shows (``console/node_provisioning.html``): the image
URL form, the newest run's steps with their times and what happened, and the runs before it.
Its answers are ``gpucap.console.provisioning``."""

from django import forms

from gpucap.bmc import provisioning
from gpucap.bmc.selectors import provisioning_steps, provisionings_of
from gpucap.fleet.models import Node
from gpucap.web.forms import ServiceErrorsMixin

PANEL = "console/node_provisioning.html"


class ProvisionForm(ServiceErrorsMixin, forms.Form):
    image_url = forms.CharField(
        label="Image URL",
        max_length=provisioning.IMAGE_URL_MAX_LENGTH,
        strip=False,
        error_messages={"required": "is required"},
        widget=forms.TextInput(
            attrs={"inputmode": "url", "placeholder": "https://images.example/installer.iso"}
        ),
        help_text="An ISO the node's BMC fetches over http(s) and boots from, once.",
    )


def provisioning_context(node: Node, *, form: ProvisionForm | None = None) -> dict:
    """The panel's part of the node page: one query."""
    runs = provisionings_of(node)
    latest = runs[0] if runs else None
    return {
        "provision_form": form or ProvisionForm(),
        "provisioning": latest,
        "provisioning_steps": provisioning_steps(latest) if latest else [],
        "provisioning_earlier": runs[1:],
        "can_provision": node.state in (Node.State.CORDONED, Node.State.DOWN),
    }
