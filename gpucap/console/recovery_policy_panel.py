"""What the cluster page's recovery policy panel shows and takes (``console/cluster_recovery.html``,
docs/bmc.md, Recovery): the cluster's policy and the form that sets it, whose rules are the
service's (``gpucap.bmc.recovery.recovery_policy_set``, as ``PUT
/api/clusters/<id>/recovery-policy/``); turning the automatic power cycle on is confirmed first.
Its answers are ``gpucap.console.cluster_recovery``."""

from django import forms

from gpucap.bmc import recovery
from gpucap.bmc.recovery_models import RecoveryPolicy
from gpucap.fleet.models import Cluster
from gpucap.web.forms import ServiceErrorsMixin

FIELDS = ("auto_power_cycle", "grace_seconds", "max_attempts", "boot_timeout_seconds")


class RecoveryPolicyForm(ServiceErrorsMixin, forms.Form):
    auto_power_cycle = forms.BooleanField(
        label="Power-cycle down nodes automatically",
        required=False,
        help_text="Through their BMC (ForceOff, then On), once a node has been down for the "
        "grace. Off: a down node waits for an operator's Power-cycle on its page.",
    )
    grace_seconds = forms.IntegerField(
        label="Grace (seconds)",
        error_messages={"required": "is required", "invalid": "must be a whole number"},
        help_text="How long a node stays down before the automatic power cycle.",
    )
    max_attempts = forms.IntegerField(
        label="Max attempts",
        error_messages={"required": "is required", "invalid": "must be a whole number"},
        help_text="Failed power cycles in a row after which recovery stops for the node until "
        "an operator clears it.",
    )
    boot_timeout_seconds = forms.IntegerField(
        label="Boot timeout (seconds)",
        error_messages={"required": "is required", "invalid": "must be a whole number"},
        help_text="How long after power on the node's hypervisor has to answer.",
    )
    # Set by the confirmation's own form: the operator has read what turning it on means.
    confirmed = forms.BooleanField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args, policy: RecoveryPolicy | None = None, **kwargs) -> None:
        if policy is not None and "data" not in kwargs and not args:
            kwargs["initial"] = {name: getattr(policy, name) for name in FIELDS}
        super().__init__(*args, **kwargs)
        for name in ("grace_seconds", "max_attempts", "boot_timeout_seconds"):
            self.fields[name].widget.attrs.update({"inputmode": "numeric"})

    def values(self) -> dict:
        return {name: self.cleaned_data[name] for name in FIELDS}


def recovery_policy_context(
    cluster: Cluster,
    *,
    form: RecoveryPolicyForm | None = None,
    confirm: dict | None = None,
    saved: bool = False,
) -> dict:
    """The panel's part of the cluster page: one query (the policy). ``confirm``: the values
    waiting for the operator to confirm turning the automatic power cycle on."""
    policy = recovery.policy_of(cluster)
    return {
        "recovery_policy": policy,
        "policy_form": form or RecoveryPolicyForm(policy=policy),
        "policy_confirm": confirm,
        "policy_saved": saved,
    }
