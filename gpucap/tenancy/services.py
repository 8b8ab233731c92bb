"""Changes to tenants, users, memberships and operators: validated, atomic, audited."""

import hashlib
import logging
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from gpucap.audit.services import Actor, audit_record
from gpucap.roles import OPERATORS_GROUP
from gpucap.tasks import on_commit
from gpucap.tenancy.models import Invitation, Membership, Tenant

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
    """Make a user a member of a tenant with a role, or change the role (operators, through a
    fleet file; a tenant's admins through ``member_set_role``). Audited, and the member is
    mailed about it."""
    if role not in Membership.Role.values:
        raise ValidationError({"role": f"unknown role {role!r}; choose admin or member"})
    membership = Membership.objects.select_for_update().filter(user=user, tenant=tenant).first()
    if membership is None:
        membership = Membership.objects.create(user=user, tenant=tenant, role=role)
        audit_record(actor=actor, verb="membership.create", target=membership, after={"role": role})
        _mail_member_on_commit(
            membership,
            subject=f"You are a member of {tenant.name}",
            body=f"{_who(actor)} made you {membership.get_role_display()} of {tenant.name} on "
            "gpucap.",
        )
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
        _mail_member_on_commit(
            membership,
            subject=f"Your role in {tenant.name} is now {membership.get_role_display()}",
            body=f"{_who(actor)} made you {membership.get_role_display()} of {tenant.name} on "
            "gpucap.",
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


@transaction.atomic
def invitation_send(
    *, tenant: Tenant, email: str, role: str, site_url: str, actor: Actor = None
) -> Invitation:
    """Invite the owner of ``email`` to ``tenant`` with ``role``: an invitation with a secret
    link, mailed to the address once the change commits. Nobody becomes a member until the
    owner of the mailbox follows the link and accepts (``invitation_accept``), so an admin can
    neither add an existing account of someone else's nor choose the password of a new one.
    The answer is the same whether an account with the address exists or not. Inviting an
    address again replaces its open invitation (the old link stops working).
    ``site_url`` is the absolute origin the link starts with."""
    email = email.strip()
    _validate_role(role)
    try:
        validate_email(email)
    except ValidationError:
        raise ValidationError({"email": f"{email!r} is not an email address"}) from None
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    # The admin sees the tenant's members and their addresses already: this tells nothing new.
    if Membership.objects.filter(tenant=tenant, user__email__iexact=email).exists():
        raise ValidationError({"email": f"{email} is already a member of {tenant.name}"})
    now = timezone.now()
    for stale in Invitation.objects.filter(
        tenant=tenant, email__iexact=email, accepted_at=None, revoked_at=None
    ):
        stale.revoked_at = now
        stale.save(update_fields=["revoked_at"])
        audit_record(actor=actor, verb="invitation.replace", target=stale)
    token = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        tenant=tenant,
        email=email,
        role=role,
        token_hash=invitation_token_hash(token),
        invited_by=actor if actor is not None and actor.is_authenticated else None,
        expires_at=now + timedelta(seconds=settings.INVITATION_TTL_SECONDS),
    )
    audit_record(
        actor=actor, verb="invitation.send", target=invitation, after={"role": role, "email": email}
    )
    link = site_url.rstrip("/") + reverse("invitation-accept", kwargs={"token": token})
    on_commit(lambda: _mail_invitation(invitation, link), what="mail invitation")
    return invitation


@transaction.atomic
def invitation_revoke(*, invitation: Invitation, actor: Actor = None) -> Invitation:
    """Withdraw an open invitation: its link stops working. Revoking twice is harmless; an
    accepted invitation is refused (remove the member instead)."""
    invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
    if invitation.accepted_at is not None:
        raise ValidationError(
            f"the invitation of {invitation.email} was accepted already; remove the member instead"
        )
    if invitation.revoked_at is None:
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
        audit_record(actor=actor, verb="invitation.revoke", target=invitation)
        tenant = invitation.tenant
        on_commit(
            lambda: _mail(
                to=invitation.email,
                subject=f"Your invitation to {tenant.name} was withdrawn",
                body=f"{_who(actor)} withdrew the invitation of {invitation.email} to join "
                f"{tenant.name} on gpucap: its link no longer works. Nothing else changed.",
            ),
            what="mail invitation withdrawn",
        )
    return invitation


@transaction.atomic
def invitation_accept(*, token: str, user: AbstractBaseUser) -> Membership:
    """``user`` accepts the invitation whose link carries ``token``: they become a member with
    its role. The link works once; someone who is a member already keeps their role."""
    invitation = _open_invitation(token)
    membership = Membership.objects.filter(user=user, tenant=invitation.tenant).first()
    if membership is None:
        membership = Membership.objects.create(
            user=user, tenant=invitation.tenant, role=invitation.role
        )
        audit_record(
            actor=user,
            verb="membership.create",
            target=membership,
            after={"role": invitation.role, "invitation": invitation.pk},
        )
    invitation.accepted_at = timezone.now()
    invitation.accepted_by = user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    audit_record(actor=user, verb="invitation.accept", target=invitation)
    on_commit(lambda: _mail_accepted(invitation, user), what="mail invitation accepted")
    _mail_member_on_commit(
        membership,
        subject=f"You joined {invitation.tenant.name}",
        body=f"You accepted the invitation of {invitation.email} and are now "
        f"{membership.get_role_display()} of {invitation.tenant.name} on gpucap, as "
        f"{user.get_username()}. If this was not you, reset your password and tell the tenant's "
        "admins.",
    )
    return membership


@transaction.atomic
def invitation_accept_new_account(*, token: str, username: str, password: str) -> Membership:
    """Accept with an account made now, for the invited address, with the username and the
    password its owner chose."""
    invitation = _open_invitation(token)  # refused before anything is made
    users = get_user_model().objects
    errors = {}
    username = username.strip()
    if not username:
        errors["username"] = "choose a username"
    elif users.filter(username__iexact=username).exists():
        errors["username"] = f"the username {username!r} is taken; choose another"
    candidate = get_user_model()(username=username, email=invitation.email)
    try:
        validate_password(password, user=candidate)
    except ValidationError as exc:
        errors["password"] = exc.messages
    if errors:
        raise ValidationError(errors)
    user = users.create_user(username=username, email=invitation.email, password=password)
    audit_record(actor=user, verb="user.create", target=user, after={"email": invitation.email})
    return invitation_accept(token=token, user=user)


def invitation_token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def invitation_for_token(token: str) -> Invitation | None:
    """The invitation a link carries, open or not; None for a token nobody issued."""
    return (
        Invitation.objects.select_related("tenant", "invited_by")
        .filter(token_hash=invitation_token_hash(token))
        .first()
    )


def _open_invitation(token: str) -> Invitation:
    """The invitation, locked, if its link still works."""
    invitation = (
        Invitation.objects.select_for_update(of=("self",))
        .select_related("tenant", "invited_by")
        .filter(token_hash=invitation_token_hash(token))
        .first()
    )
    if invitation is None or not invitation.is_open(timezone.now()):
        raise ValidationError(INVITATION_GONE)
    return invitation


INVITATION_GONE = (
    "this invitation no longer works: it was used, withdrawn or has expired. Ask the tenant's "
    "admin to invite you again."
)


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
    # membership_set audits the change and mails the member.
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
    on_commit(
        lambda: _mail_member(
            membership,
            subject=f"You were removed from {membership.tenant.name}",
            body=f"{_who(actor)} removed you from {membership.tenant.name} on gpucap. You no "
            "longer see its VMs, deployments and usage; your account stays.",
        ),
        what="mail membership removed",
    )


def _validate_role(role: str) -> None:
    if role not in Membership.Role.values:
        raise ValidationError({"role": f"unknown role {role!r}; choose admin or member"})


def _admin_count(tenant_id: int) -> int:
    return Membership.objects.filter(tenant_id=tenant_id, role=Membership.Role.ADMIN).count()


def _who(actor: Actor) -> str:
    return actor.get_username() if actor is not None and actor.is_authenticated else "An admin"


def _mail(*, to: str, subject: str, body: str) -> None:
    """Mail after the change committed (in development the console backend prints it). A mail
    server that is down loses the mail, never the change."""
    send_mail(
        subject=subject,
        message=body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[to],
        fail_silently=True,
    )


def _mail_invitation(invitation: Invitation, link: str) -> None:
    tenant = invitation.tenant
    logger.info("invitation %s to %s sent to %s", invitation.pk, tenant.slug, invitation.email)
    _mail(
        to=invitation.email,
        subject=f"You are invited to {tenant.name} on gpucap",
        body=(
            f"{_who(invitation.invited_by)} invited {invitation.email} to join {tenant.name} on "
            f"gpucap as {invitation.get_role_display()}.\n\n"
            f"To accept, open this link (it works once, until "
            f"{invitation.expires_at:%Y-%m-%d %H:%M} UTC):\n\n{link}\n\n"
            "If you did not expect this, ignore this mail: nothing happens until you accept."
        ),
    )


def _mail_accepted(invitation: Invitation, user: AbstractBaseUser) -> None:
    if invitation.invited_by is None or not invitation.invited_by.email:
        return
    _mail(
        to=invitation.invited_by.email,
        subject=f"{user.get_username()} joined {invitation.tenant.name}",
        body=(
            f"{invitation.email} accepted your invitation and joined {invitation.tenant.name} "
            f"as {user.get_username()} ({invitation.get_role_display()})."
        ),
    )


def _mail_member(membership: Membership, *, subject: str, body: str) -> None:
    if membership.user.email:
        _mail(to=membership.user.email, subject=subject, body=body)


def _mail_member_on_commit(membership: Membership, *, subject: str, body: str) -> None:
    on_commit(
        lambda: _mail_member(membership, subject=subject, body=body), what="mail membership changed"
    )
