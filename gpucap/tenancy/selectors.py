"""Reads of tenants, members and invitations. A tenant member sees only their own tenants;
operators see all."""

from django.contrib.auth.models import AbstractBaseUser
from django.http import Http404

from gpucap.roles import is_operator, tenant_ids_for
from gpucap.tenancy.models import Invitation, Membership, Tenant


def tenants_for(user: AbstractBaseUser) -> list[Tenant]:
    """The tenants a user is a member of, by name. One query."""
    return list(Tenant.objects.filter(memberships__user=user).order_by("name"))


def tenant_visible_to(*, user: AbstractBaseUser, slug: str) -> Tenant:
    """The tenant, if the user may see it; otherwise 404 (another tenant's page does not
    exist as far as its outsiders can tell)."""
    tenants = Tenant.objects.all()
    if not is_operator(user):
        tenants = tenants.filter(pk__in=tenant_ids_for(user))
    tenant = tenants.filter(slug=slug).first()
    if tenant is None:
        raise Http404("No such tenant.")
    return tenant


def viewer_role(*, tenant: Tenant, user: AbstractBaseUser) -> str:
    """How ``user`` sees ``tenant``: "admin" or "member" for its members, "operator" for an
    operator looking in read-only. One query (none more for an operator's role check that
    was made already)."""
    role = (
        Membership.objects.filter(tenant=tenant, user_id=user.pk)
        .values_list("role", flat=True)
        .first()
    )
    if role is not None:
        return role
    if is_operator(user):
        return "operator"
    # Callers fetch the tenant through tenant_visible_to, so this is a programming error.
    raise Http404("No such tenant.")


# --- members ----------------------------------------------------------------------------------


def tenant_members(*, tenant: Tenant) -> list[Membership]:
    """A tenant's members with their accounts, by username. One query."""
    return list(tenant.memberships.select_related("user").order_by("user__username"))


def tenant_invitations(*, tenant: Tenant) -> list[Invitation]:
    """A tenant's invitations waiting for an answer (expired ones too, so an admin sees why
    someone never joined), newest first. One query."""
    return list(
        tenant.invitations.filter(accepted_at=None, revoked_at=None).select_related("invited_by")
    )


def tenant_invitation(*, tenant: Tenant, pk: int) -> Invitation:
    """One invitation of the tenant, or 404 (another tenant's invitation id included)."""
    invitation = tenant.invitations.select_related("tenant").filter(pk=pk).first()
    if invitation is None:
        raise Http404("No such invitation.")
    return invitation


def tenant_member(*, tenant: Tenant, pk: int) -> Membership:
    """One membership of the tenant, or 404 (another tenant's membership id included)."""
    membership = tenant.memberships.select_related("user", "tenant").filter(pk=pk).first()
    if membership is None:
        raise Http404("No such member.")
    return membership
