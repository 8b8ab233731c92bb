"""What the node page's BMC panel shows and takes (``console/node_bmc.html``): the panel's read
(``gpucap.bmc.selectors.bmc_panel``) and the credentials form, whose rules are the service's
(``gpucap.bmc.services.bmc_credential_set``). Its answers are ``gpucap.console.bmc_panel``."""

from django import forms

from gpucap.bmc.models import BmcCredential
from gpucap.bmc.selectors import bmc_panel
from gpucap.fleet.models import Node
from gpucap.web.forms import ServiceErrorsMixin


class BmcCredentialForm(ServiceErrorsMixin, forms.Form):
    """How gpucap logs in to the node's BMC. The password is never shown back: the field is
    always empty, and left empty it keeps the stored one."""

    username = forms.CharField(
        label="User", max_length=128, error_messages={"required": "is required"}
    )
    password = forms.CharField(
        label="Password",
        required=False,
        max_length=256,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
    )
    verify_tls = forms.BooleanField(
        label="Verify the BMC's TLS certificate", required=False, initial=True
    )
    system_id = forms.CharField(
        label="System id",
        required=False,
        max_length=64,
        help_text="The Redfish ComputerSystem id when the BMC manages several; empty: its only "
        "one.",
    )

    def __init__(self, *args, credential: BmcCredential | None = None, **kwargs) -> None:
        if credential is not None and "data" not in kwargs and not args:
            kwargs["initial"] = {
                "username": credential.username,
                "verify_tls": credential.verify_tls,
                "system_id": credential.system_id,
            }
        super().__init__(*args, **kwargs)
        self.fields["password"].help_text = (
            "Never shown back. Leave it empty to keep the stored one."
            if credential is not None
            else "Required: no password is stored for this BMC yet."
        )

    def values(self) -> dict:
        """The service's keywords: an empty password keeps the stored one."""
        data = self.cleaned_data
        return {
            "username": data["username"],
            "password": data["password"] or None,
            "verify_tls": data["verify_tls"],
            "system_id": data["system_id"],
        }


def bmc_context(node: Node, *, form: BmcCredentialForm | None = None) -> dict:
    """The panel's part of the node page: two queries (``bmc_panel``)."""
    panel = bmc_panel(node)
    return {
        "bmc": panel,
        "credential_form": form or BmcCredentialForm(credential=panel.credential),
    }
