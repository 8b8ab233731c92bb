"""Forms of the members page. They check the shape of what was typed; the rules (one admin at
least, no member twice) are the services', and a service's errors land next to the fields they
name."""

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import forms as auth_forms
from django.contrib.auth import get_user_model

from gpucap.tenancy.models import Membership
from gpucap.tenancy.password_attempts import PasswordAttemptsMixin
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


class InvitationAccountForm(PasswordAttemptsMixin, ServiceErrorsMixin, forms.Form):
    """Accept an invitation with a new account: its owner chooses the username and password.
    Its attempts count against the invited address and the client's (``request`` and
    ``invited_email`` set by the view)."""

    error_fields = {"password": "password1"}
    invited_email = ""

    def attempts_account(self) -> str:
        return self.invited_email

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


# --- password forms: how often each may be tried (gpucap.tenancy.password_attempts) ----------


class LoginForm(PasswordAttemptsMixin, auth_forms.AuthenticationForm):
    """/login/: a wrong password counts against the username typed and the client address."""

    attempts_count = "failures"

    def attempts_account(self) -> str:
        return self.data.get("username", "")


class AdminLoginForm(PasswordAttemptsMixin, AdminAuthenticationForm):
    """/admin/login/, counted with /login/'s failures."""

    attempts_count = "failures"

    def attempts_account(self) -> str:
        return self.data.get("username", "")


class PasswordResetForm(PasswordAttemptsMixin, auth_forms.PasswordResetForm):
    """Django's, for accounts with no password yet too (someone invited before invitations
    were consented): the link goes to the account's own address either way. Every request
    counts against the address typed and the client's (``request`` set by the view)."""

    def attempts_account(self) -> str:
        return self.data.get("email", "")

    def get_users(self, email: str):
        users = get_user_model()._default_manager.filter(email__iexact=email, is_active=True)
        return (user for user in users if user.email.lower() == email.lower())


class SetPasswordForm(PasswordAttemptsMixin, auth_forms.SetPasswordForm):
    """The reset link's form; every post counts against the account and the client address
    (``request`` set by the view)."""

    def attempts_account(self) -> str:
        return self.user.get_username() if self.user is not None else ""
