"""Who may see what. Operators are staff users in the ``operators`` group (or superusers);
everyone else sees only the tenants they are members of. Operators look at any tenant's pages
and API read-only: only a tenant's members change its VMs, deployments, API keys and members
(``tenant_change_check``, the one check every tenant-side change makes)."""

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied

OPERATORS_GROUP = "operators"


def is_operator(user: AbstractBaseUser | AnonymousUser) -> bool:
    if not user.is_authenticated or not user.is_active:
        return False
    if user.is_superuser:
        return True
    if not user.is_staff:
        return False
    cached = getattr(user, "_gpucap_is_operator", None)
    if cached is None:
        cached = user.groups.filter(name=OPERATORS_GROUP).exists()
        user._gpucap_is_operator = cached
    return cached


def tenant_ids_for(user: AbstractBaseUser | AnonymousUser) -> list[int]:
    """The tenants a user is a member of (cached on the user object for one request)."""
    if not user.is_authenticated:
        return []
    cached = getattr(user, "_gpucap_tenant_ids", None)
    if cached is None:
        cached = list(user.memberships.values_list("tenant_id", flat=True))
        user._gpucap_tenant_ids = cached
    return cached


READ_ONLY = (
    "Operators look at a tenant's VMs, deployments, API keys and members read-only: only the "
    "tenant's members change them."
)


def tenant_change_allowed(user: AbstractBaseUser | AnonymousUser, tenant_id: int) -> bool:
    """Whether ``user`` may change what belongs to the tenant: its members may; anyone else,
    operators included, only looks."""
    return tenant_id in tenant_ids_for(user)


def tenant_change_check(user: AbstractBaseUser | AnonymousUser, tenant_id: int) -> None:
    """The one check every tenant-side change (page or API) makes before anything else:
    ``PermissionDenied`` (403) for anyone who is not a member of the tenant. Operators act on a
    tenant's capacity only through their own commands (reclaim with notice, drain, place)."""
    if not tenant_change_allowed(user, tenant_id):
        raise PermissionDenied(READ_ONLY)
