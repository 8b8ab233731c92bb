"""A tenant's members and invitations, accepting an invitation, and passwords.

Operators may open any tenant's members read-only: the page renders without its forms, and what
a form would post is refused with 403. A tenant that is not yours is a 404, as if it did not
exist.
"""

from collections.abc import Callable
from functools import wraps

from django.contrib import admin
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse_lazy
from django.utils import timezone
from django.utils.cache import patch_cache_control
from django.utils.decorators import method_decorator
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpucap.roles import tenant_change_check
from gpucap.tenancy import selectors, services
from gpucap.tenancy.forms import (
    InvitationAccountForm,
    LoginForm,
    MemberInviteForm,
    MemberRoleForm,
    PasswordResetForm,
    SetPasswordForm,
)
from gpucap.tenancy.models import Membership, Tenant
from gpucap.web.pages import render_page, site_url, tenant_nav

# --- members ----------------------------------------------------------------------------------


@require_GET
@login_required
def members(request: HttpRequest, slug: str) -> HttpResponse:
    """Every member of the tenant. Admins also get the forms to invite, change roles and
    remove; other members and operators see the list only."""
    tenant = selectors.tenant_visible_to(user=request.user, slug=slug)
    role = selectors.viewer_role(tenant=tenant, user=request.user)
    return _members_page(request, tenant, role)


@require_POST
@login_required
def member_invite(request: HttpRequest, slug: str) -> HttpResponse:
    """Invite by email address: the link goes to the address only, never to this page."""
    tenant = _admin_tenant(request, slug)
    form = MemberInviteForm(request.POST)
    invitation = None
    if form.is_valid():
        try:
            invitation = services.invitation_send(
                tenant=tenant, site_url=site_url(request), actor=request.user, **form.cleaned_data
            )
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            form = MemberInviteForm()
    return _members_page(
        request,
        tenant,
        Membership.Role.ADMIN,
        invite_form=form,
        invitation=invitation,
        status=200 if invitation else 400,
    )


@require_POST
@login_required
def invitation_revoke(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    tenant = _admin_tenant(request, slug)
    invitation = selectors.tenant_invitation(tenant=tenant, pk=pk)
    error = _refusal(lambda: services.invitation_revoke(invitation=invitation, actor=request.user))
    return _after_change(request, tenant, error, f"Withdrew the invitation of {invitation.email}.")


@require_POST
@login_required
def member_set_role(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    tenant = _admin_tenant(request, slug)
    membership = selectors.tenant_member(tenant=tenant, pk=pk)
    form = MemberRoleForm(request.POST)
    if form.is_valid():
        role = form.cleaned_data["role"]
        error = _refusal(
            lambda: services.member_set_role(membership=membership, role=role, actor=request.user)
        )
    else:
        error = "; ".join(f"{name}: {' '.join(errs)}" for name, errs in form.errors.items())
    membership.refresh_from_db()
    who = membership.user.get_username()
    return _after_change(request, tenant, error, f"{who} is now {membership.get_role_display()}.")


@require_POST
@login_required
def member_remove(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    tenant = _admin_tenant(request, slug)
    membership = selectors.tenant_member(tenant=tenant, pk=pk)
    error = _refusal(lambda: services.member_remove(membership=membership, actor=request.user))
    who = membership.user.get_username()
    return _after_change(request, tenant, error, f"Removed {who} from {tenant.name}.")


def _refusal(change) -> str:
    """Make the change; the service's reason if it refused, else ""."""
    try:
        change()
    except ValidationError as exc:
        return "; ".join(exc.messages)
    return ""


def _after_change(request: HttpRequest, tenant: Tenant, error: str, done: str) -> HttpResponse:
    """A plain post goes back to the members page; an HTMX one gets the refreshed panel, saying
    what was done or why nothing was (the viewer's role may have changed: they may have acted
    on themselves)."""
    if not error and not request.htmx:
        return redirect("tenant-members", slug=tenant.slug)
    return _members_page(
        request,
        tenant,
        _role_after(request, tenant),
        error=error,
        done="" if error else done,
        status=400 if error else 200,
    )


def _admin_tenant(request: HttpRequest, slug: str) -> Tenant:
    """The tenant, if the user is one of its admins: outsiders get 404, its other members and
    operators (who look in read-only) 403."""
    tenant = selectors.tenant_visible_to(user=request.user, slug=slug)
    tenant_change_check(request.user, tenant.pk)
    if selectors.viewer_role(tenant=tenant, user=request.user) != Membership.Role.ADMIN:
        raise PermissionDenied("Only the tenant's admins manage its members.")
    return tenant


def _role_after(request: HttpRequest, tenant: Tenant) -> str:
    """The viewer's role after a change, which may have been to themselves."""
    try:
        return selectors.viewer_role(tenant=tenant, user=request.user)
    except Http404:  # they removed themselves: no more forms for them
        return "former"


def _members_page(
    request: HttpRequest, tenant: Tenant, role: str, *, status: int = 200, **extra
) -> HttpResponse:
    is_admin = role == Membership.Role.ADMIN
    extra.setdefault("invite_form", MemberInviteForm() if is_admin else None)
    context = {
        "nav": tenant_nav(request),
        "tenant": tenant,
        "role": role,
        "read_only": role == "operator",
        "is_admin": is_admin,
        "members": selectors.tenant_members(tenant=tenant),
        "invitations": selectors.tenant_invitations(tenant=tenant) if is_admin else [],
        "now": timezone.now(),
        "roles": Membership.Role.choices,
        **extra,
    }
    return render_page(
        request, "tenancy/members.html", context, fragment="members-panel", status=status
    )


# --- accepting an invitation ----------------------------------------------------------------


def password_form(view: Callable) -> Callable:
    """A password form's view: a post its form refused for too many attempts
    (``PasswordAttemptsMixin``) answers 429 with ``Retry-After``, the form and its message
    shown as usual."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        response = view(request, *args, **kwargs)
        wait = getattr(request, "password_attempts_wait", 0)
        if wait and response.status_code in (200, 400):
            response.status_code = 429
            response["Retry-After"] = str(wait)
        return response

    return wrapped


class _RequestInForm:
    """For Django's password views, whose forms are not given the request."""

    def get_form(self, form_class=None):
        form = super().get_form(form_class)
        form.request = self.request
        return form


# --- signing in -------------------------------------------------------------------------------

login_page = password_form(auth_views.LoginView.as_view(authentication_form=LoginForm))
# The admin's sign-in form is tenancy.forms.AdminLoginForm (set in tenancy/admin.py).
admin_login = password_form(admin.site.login)


@password_form
@require_http_methods(["GET", "POST"])
def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    """The link an invitation mail carries. Signed in, its owner accepts as that account;
    otherwise they sign in first (and come back here) or make an account, choosing its
    username and password. A used, withdrawn or expired link says so and offers nothing."""
    invitation = services.invitation_for_token(token)
    if invitation is None or not invitation.is_open(timezone.now()):
        response = render(request, "tenancy/invitation.html", {"gone": True}, status=410)
        patch_cache_control(response, no_store=True, private=True)
        return response
    form = InvitationAccountForm()
    error = ""
    if request.method == "POST":
        try:
            if request.user.is_authenticated:
                services.invitation_accept(token=token, user=request.user)
                return redirect("tenant-detail", slug=invitation.tenant.slug)
            form = InvitationAccountForm(request.POST)
            form.request, form.invited_email = request, invitation.email
            if form.is_valid():
                membership = services.invitation_accept_new_account(
                    token=token,
                    username=form.cleaned_data["username"],
                    password=form.cleaned_data["password1"],
                )
                login(request, membership.user)
                return redirect("tenant-detail", slug=invitation.tenant.slug)
        except ValidationError as exc:
            if getattr(exc, "error_dict", None):
                form.add_service_errors(exc)
            else:
                error = "; ".join(exc.messages)
    context = {"invitation": invitation, "form": form, "error": error, "gone": False}
    status = 400 if request.method == "POST" else 200
    response = render(request, "tenancy/invitation.html", context, status=status)
    patch_cache_control(response, no_store=True, private=True)
    return response


# --- passwords: set only by their owners ------------------------------------------------------


@method_decorator(password_form, name="dispatch")
class PasswordResetView(_RequestInForm, auth_views.PasswordResetView):
    """ "Forgot your password?": a reset link mailed to the account's address. The answer is
    the same whether an account has the address or not."""

    form_class = PasswordResetForm
    template_name = "registration/password_reset.html"
    email_template_name = "registration/password_reset_email.txt"
    subject_template_name = "registration/password_reset_subject.txt"
    success_url = reverse_lazy("password-reset-sent")


class PasswordResetSentView(auth_views.PasswordResetDoneView):
    template_name = "registration/password_reset_sent.html"


@method_decorator(password_form, name="dispatch")
class SetPasswordView(_RequestInForm, auth_views.PasswordResetConfirmView):
    """The link a password reset mail carries: choose a password, once. The token stops
    working once the password is set, and after ``PASSWORD_RESET_TIMEOUT``."""

    form_class = SetPasswordForm

    template_name = "registration/set_password.html"
    success_url = reverse_lazy("set-password-done")


class SetPasswordDoneView(auth_views.PasswordResetCompleteView):
    template_name = "registration/set_password_done.html"
