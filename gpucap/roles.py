"""Who may see what. Operators are staff users in the ``operators`` group (or superusers);
everyone else sees only the tenants they are members of."""

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

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
