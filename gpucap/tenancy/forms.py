"""Forms of the members page. They check the shape of what was typed; the rules (one admin at
least, no member twice) are the services', and a service's errors land next to the fields they
name."""

from django import forms

from gpucap.inference.forms import ServiceErrorsMixin
from gpucap.tenancy.models import Membership


class MemberInviteForm(ServiceErrorsMixin, forms.Form):
    email = forms.EmailField(
        label="Email address",
        help_text="Someone without an account gets one, and a link to choose a password.",
    )
    role = forms.ChoiceField(
        label="Role", choices=Membership.Role.choices, initial=Membership.Role.MEMBER
    )


class MemberRoleForm(ServiceErrorsMixin, forms.Form):
    role = forms.ChoiceField(label="Role", choices=Membership.Role.choices)
