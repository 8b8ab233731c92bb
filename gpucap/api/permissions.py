"""Who may call what: operators write the fleet, everyone reads what their queryset shows."""

from rest_framework import permissions

from gpucap.roles import is_operator


class IsOperator(permissions.BasePermission):
    message = "Only operators may do this."

    def has_permission(self, request, view) -> bool:
        return is_operator(request.user)


class IsOperatorOrReadOnly(permissions.BasePermission):
    """Operators write; any authenticated user reads what the view's queryset lets them see."""

    message = "Only operators may change this."

    def has_permission(self, request, view) -> bool:
        if not request.user.is_authenticated:
            return False
        return request.method in permissions.SAFE_METHODS or is_operator(request.user)
