"""Changes to tenants, users, memberships and operators: validated, atomic, audited."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.core.exceptions import ValidationError
from django.db import transaction

from gpucap.audit.services import Actor, audit_record
from gpucap.tenancy.models import Membership, Tenant
from gpucap.tenancy.roles import OPERATORS_GROUP


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
