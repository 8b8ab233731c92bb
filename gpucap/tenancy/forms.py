"""Forms of the members page. They check the shape of what was typed; the rules (one admin at
least, no member twice) are the services', and a service's errors land next to the fields they
name."""

from django import forms

from gpucap.tenancy.models import Membership
from gpucap.web.forms import ServiceErrorsMixin


class MemberInviteForm(ServiceErrorsMixin, forms.Form):
    email = forms.EmailField(
        label="Email address",
        help_text="They get a link by mail and join once they accept.",
    )
    role = forms.ChoiceField(
        label="Role", choices=Membership.Role.choices, initial=Membership.Role.MEMBER
    )


class MemberRoleForm(ServiceErrorsMixin, forms.Form):
    role = forms.ChoiceField(label="Role", choices=Membership.Role.choices)


class InvitationAccountForm(ServiceErrorsMixin, forms.Form):
    """Accept an invitation with a new account: its owner chooses the username and password."""

    error_fields = {"password": "password1"}

    username = forms.CharField(label="Username", max_length=150)
    password1 = forms.CharField(
        label="Password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )
    password2 = forms.CharField(
        label="Password again",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )

    def clean(self) -> dict:
        data = super().clean()
        if data.get("password1") and data.get("password1") != data.get("password2"):
            self.add_error("password2", "The two passwords differ.")
        return data
