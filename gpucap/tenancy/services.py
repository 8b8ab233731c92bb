"""Changes to tenants, users, memberships and operators: validated, atomic, audited."""

import logging
import re
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.contrib.auth.tokens import default_token_generator
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from gpucap.audit.services import Actor, audit_record
from gpucap.tenancy.models import Membership, Tenant
from gpucap.tenancy.roles import OPERATORS_GROUP

logger = logging.getLogger(__name__)


@transaction.atomic
def tenant_create(*, name: str, slug: str, actor: Actor = None) -> Tenant:
    errors = {}
    if Tenant.objects.filter(slug=slug).exists():
        errors["slug"] = f"a tenant with slug {slug!r} already exists"
    if Tenant.objects.filter(name=name).exists():
        errors["name"] = f"a tenant named {name!r} already exists"
    if errors:
        raise ValidationError(errors)
    tenant = Tenant.objects.create(name=name, slug=slug)
    audit_record(actor=actor, verb="tenant.create", target=tenant, after={"name": name})
    return tenant


@transaction.atomic
def tenant_rename(*, tenant: Tenant, name: str, actor: Actor = None) -> Tenant:
    if Tenant.objects.filter(name=name).exclude(pk=tenant.pk).exists():
        raise ValidationError({"name": f"a tenant named {name!r} already exists"})
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    before = tenant.name
    if before == name:
        return tenant
    tenant.name = name
    tenant.save(update_fields=["name"])
    audit_record(
        actor=actor,
        verb="tenant.rename",
        target=tenant,
        before={"name": before},
        after={"name": name},
    )
    return tenant


@transaction.atomic
def user_create(
    *, username: str, email: str = "", password: str | None = None, actor: Actor = None
) -> AbstractBaseUser:
    """A login. Without a password the account cannot log in until one is set."""
    users = get_user_model().objects
    if users.filter(username=username).exists():
        raise ValidationError({"username": f"a user named {username!r} already exists"})
    user = users.create_user(username=username, email=email, password=password)
    audit_record(actor=actor, verb="user.create", target=user, after={"email": email})
    return user


@transaction.atomic
def user_update(
    *,
    user: AbstractBaseUser,
    email: str | None = None,
    password: str | None = None,
    actor: Actor = None,
) -> AbstractBaseUser:
    user = get_user_model().objects.select_for_update().get(pk=user.pk)
    before, after = {}, {}
    if email is not None and email != user.email:
        before["email"], after["email"] = user.email, email
        user.email = email
    if password is not None:
        user.set_password(password)
        after["password"] = "changed"  # never the password itself
    if after:
        user.save()
        audit_record(actor=actor, verb="user.update", target=user, before=before, after=after)
    return user


@transaction.atomic
def membership_set(
    *, user: AbstractBaseUser, tenant: Tenant, role: str, actor: Actor = None
) -> Membership:
    """Make a user a member of a tenant with a role, or change the role."""
    if role not in Membership.Role.values:
        raise ValidationError({"role": f"unknown role {role!r}; choose admin or member"})
    membership = Membership.objects.select_for_update().filter(user=user, tenant=tenant).first()
    if membership is None:
        membership = Membership.objects.create(user=user, tenant=tenant, role=role)
        audit_record(actor=actor, verb="membership.create", target=membership, after={"role": role})
    elif membership.role != role:
        before = membership.role
        membership.role = role
        membership.save(update_fields=["role"])
        audit_record(
            actor=actor,
            verb="membership.set_role",
            target=membership,
            before={"role": before},
            after={"role": role},
        )
    return membership


@transaction.atomic
def operator_grant(*, user: AbstractBaseUser, actor: Actor = None) -> AbstractBaseUser:
    """Make a user an operator: staff, in the operators group."""
    group, _ = Group.objects.get_or_create(name=OPERATORS_GROUP)
    user = get_user_model().objects.select_for_update().get(pk=user.pk)
    in_group = user.groups.filter(pk=group.pk).exists()
    if user.is_staff and in_group:
        return user
    if not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    if not in_group:
        user.groups.add(group)
    audit_record(actor=actor, verb="operator.grant", target=user, after={"group": group.name})
    return user


# --- members of a tenant, managed by its admins ---------------------------------------------------


@dataclass(frozen=True)
class Invitation:
    membership: Membership
    created_user: bool  # a new account was made for the address
    # Where the invited person chooses a password; empty for someone who has one already.
    set_password_url: str


@transaction.atomic
def member_invite(
    *, tenant: Tenant, email: str, role: str, site_url: str, actor: Actor = None
) -> Invitation:
    """Make the owner of ``email`` a member of ``tenant`` with ``role``. Someone without an
    account gets one (username from the address, no usable password) and, like anyone who has
    never set a password, a set-password link: mailed to them once the change commits, and
    logged. The link is returned (for the admin to pass on) only when the account is new.
    ``site_url`` is the absolute origin the link starts with."""
    email = email.strip()
    _validate_role(role)
    try:
        validate_email(email)
    except ValidationError:
        raise ValidationError({"email": f"{email!r} is not an email address"}) from None
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    users = get_user_model().objects
    user = users.filter(email__iexact=email).order_by("pk").first()
    if user is not None and Membership.objects.filter(user=user, tenant=tenant).exists():
        raise ValidationError(
            {"email": f"{email} is already a member of {tenant.name} (as {user.get_username()})"}
        )
    created_user = user is None
    if created_user:
        user = users.create_user(username=_free_username(email), email=email, password=None)
        audit_record(actor=actor, verb="user.create", target=user, after={"email": email})
    membership = Membership.objects.create(user=user, tenant=tenant, role=role)
    audit_record(
        actor=actor,
        verb="membership.invite",
        target=membership,
        after={"role": role, "email": email, "new_account": created_user},
    )
    link = ""
    if not user.has_usable_password():
        link = site_url.rstrip("/") + set_password_path(user)
        transaction.on_commit(lambda: _send_invitation(membership, link, actor))
    # The inviting admin sees the link only for the account this invitation made: an existing
    # account may belong to other tenants too, and its link would let this admin take it over.
    shown = link if created_user else ""
    return Invitation(membership=membership, created_user=created_user, set_password_url=shown)


@transaction.atomic
def member_set_role(*, membership: Membership, role: str, actor: Actor = None) -> Membership:
    """Change a member's role. A tenant keeps at least one admin."""
    _validate_role(role)
    Tenant.objects.select_for_update().filter(pk=membership.tenant_id).get()
    membership = Membership.objects.select_related("user", "tenant").get(pk=membership.pk)
    if membership.role == role:
        return membership
    if membership.role == Membership.Role.ADMIN and _admin_count(membership.tenant_id) == 1:
        raise ValidationError(
            {
                "role": f"{membership.user.get_username()} is the last admin of "
                f"{membership.tenant.name}; make someone else admin first"
            }
        )
    return membership_set(user=membership.user, tenant=membership.tenant, role=role, actor=actor)


@transaction.atomic
def member_remove(*, membership: Membership, actor: Actor = None) -> None:
    """Take a member out of a tenant (the account stays). A tenant keeps at least one admin,
    so its last admin cannot remove themselves either."""
    Tenant.objects.select_for_update().filter(pk=membership.tenant_id).get()
    membership = (
        Membership.objects.select_related("user", "tenant").filter(pk=membership.pk).first()
    )
    if membership is None:
        return  # removed already: removing twice is harmless
    if membership.role == Membership.Role.ADMIN and _admin_count(membership.tenant_id) == 1:
        raise ValidationError(
            f"{membership.user.get_username()} is the last admin of {membership.tenant.name}; "
            "make someone else admin first"
        )
    audit_record(
        actor=actor,
        verb="membership.remove",
        target=membership,
        before={"role": membership.role, "user": membership.user.get_username()},
    )
    membership.delete()


def set_password_path(user: AbstractBaseUser) -> str:
    """The path of the page where ``user`` chooses a password. The token is Django's password
    reset token: it works once (it hashes the password, which using it changes) and expires
    after ``PASSWORD_RESET_TIMEOUT``."""
    return reverse(
        "set-password",
        kwargs={
            "uidb64": urlsafe_base64_encode(force_bytes(user.pk)),
            "token": default_token_generator.make_token(user),
        },
    )


def _validate_role(role: str) -> None:
    if role not in Membership.Role.values:
        raise ValidationError({"role": f"unknown role {role!r}; choose admin or member"})


def _admin_count(tenant_id: int) -> int:
    return Membership.objects.filter(tenant_id=tenant_id, role=Membership.Role.ADMIN).count()


def _free_username(email: str) -> str:
    """A username from the address's local part (``nina.k@acme.example`` -> ``nina.k``), with a
    number added when it is taken."""
    base = re.sub(r"[^\w.@+-]", "", email.split("@", 1)[0])[:140] or "user"
    users = get_user_model().objects
    taken = set(users.filter(username__istartswith=base).values_list("username", flat=True))
    taken = {name.lower() for name in taken}
    candidate, n = base, 1
    while candidate.lower() in taken:
        n += 1
        candidate = f"{base}{n}"
    return candidate


def _send_invitation(membership: Membership, link: str, actor: Actor) -> None:
    """Mail the set-password link (in development the console backend prints it) and log it."""
    tenant, user = membership.tenant, membership.user
    who = actor.get_username() if actor is not None and actor.is_authenticated else "An admin"
    logger.info("invitation for %s to %s: set a password at %s", user.email, tenant.slug, link)
    send_mail(
        subject=f"You are invited to {tenant.name} on gpucap",
        message=(
            f"{who} added you to {tenant.name} on gpucap as {membership.get_role_display()}.\n\n"
            f"Your username is {user.get_username()}. Choose a password here (the link works "
            f"once):\n\n{link}\n"
        ),
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[user.email],
        fail_silently=True,
    )
