"""REST API for tenancy: the tenants a user may see, their members, and API tokens.

Operators see every tenant; a member sees only the tenants they belong to, and another
tenant's id answers 404, as if it did not exist. A tenant's admins manage its members; its
other members and operators read the list, and a write from them answers 403.
"""

from collections.abc import Mapping

from django.core.exceptions import PermissionDenied
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers, status, viewsets
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.decorators import action
from rest_framework.exceptions import Throttled, ValidationError
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.throttling import ScopedRateThrottle

from gpucap.api.base import InputSerializer
from gpucap.api.schema import AutoSchema
from gpucap.roles import is_operator, tenant_change_check, tenant_ids_for
from gpucap.tenancy import password_attempts, selectors, services
from gpucap.tenancy.models import Invitation, Membership, Tenant
from gpucap.web.pages import site_url


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "created_at"]
        read_only_fields = fields


@extend_schema_field(
    {"type": "string", "pattern": "^(admin|member)$", "description": "`admin` or `member`."}
)
class RoleField(serializers.ChoiceField):
    """A member's role. Documented without an enum component, whose name "Role" would clash
    with the VMs' role."""

    def __init__(self, **kwargs) -> None:
        super().__init__(choices=Membership.Role.choices, **kwargs)


class MemberSerializer(serializers.ModelSerializer):
    role = RoleField(read_only=True)
    username = serializers.CharField(source="user.username", read_only=True)
    email = serializers.EmailField(source="user.email", read_only=True)
    joined_at = serializers.DateTimeField(source="created_at", read_only=True)
    last_login = serializers.DateTimeField(
        source="user.last_login", read_only=True, allow_null=True, help_text="Null: never."
    )

    class Meta:
        model = Membership
        fields = ["id", "username", "email", "role", "joined_at", "last_login"]
        read_only_fields = fields


class MemberInviteSerializer(InputSerializer):
    email = serializers.EmailField()
    role = RoleField(default="member")


class MemberRoleSerializer(InputSerializer):
    role = RoleField()


class InvitationSerializer(serializers.ModelSerializer):
    role = RoleField(read_only=True)
    invited_by = serializers.CharField(
        source="invited_by.username", read_only=True, allow_null=True, default=None
    )

    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "invited_by", "created_at", "expires_at"]
        read_only_fields = fields


class TenantViewSet(viewsets.ReadOnlyModelViewSet):
    """Tenants: every tenant for operators, a member's own tenants for everyone else; their
    members and invitations. The API serves it with the pools each tenant may use
    (gpucap.portal.api, above the fleet that owns pools)."""

    schema = AutoSchema()
    serializer_class = TenantSerializer
    filterset_fields = ["slug"]

    def get_queryset(self):
        return self.visible(Tenant.objects.all())

    def visible(self, tenants):
        if getattr(self, "swagger_fake_view", False) or is_operator(self.request.user):
            return tenants
        return tenants.filter(pk__in=tenant_ids_for(self.request.user))

    @extend_schema(responses=MemberSerializer(many=True), description="The tenant's members.")
    # Unpaginated and unfiltered (a tenant has few members): the schema says a plain list.
    @action(
        detail=True, methods=["get"], url_path="members", pagination_class=None, filter_backends=[]
    )
    def members(self, request, pk=None):
        tenant = self.get_object()
        members = selectors.tenant_members(tenant=tenant)
        return Response(MemberSerializer(members, many=True).data)

    @extend_schema(
        methods=["GET"],
        responses=InvitationSerializer(many=True),
        description="Invitations waiting for an answer, expired ones included (tenant admins).",
    )
    @extend_schema(
        methods=["POST"],
        request=MemberInviteSerializer,
        responses={201: InvitationSerializer},
        description="Invite an email address (tenant admins). The link is mailed to the address "
        "and never answered here; nobody joins until the owner of the address accepts. The "
        "answer is the same whether the address has an account or not. Inviting an address "
        "again replaces its open invitation.",
    )
    @action(
        detail=True,
        methods=["get", "post"],
        url_path="invitations",
        pagination_class=None,
        filter_backends=[],
    )
    def invitations(self, request, pk=None):
        tenant = self.get_object()
        self._require_admin(tenant)
        if request.method == "GET":
            invitations = selectors.tenant_invitations(tenant=tenant)
            return Response(InvitationSerializer(invitations, many=True).data)
        data = MemberInviteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        invitation = services.invitation_send(
            tenant=tenant,
            site_url=site_url(request),
            actor=request.user,
            **data.validated_data,
        )
        return Response(InvitationSerializer(invitation).data, status.HTTP_201_CREATED)

    @extend_schema(
        responses={204: OpenApiResponse(description="Withdrawn: its link no longer works.")},
        description="Withdraw an invitation (tenant admins). Withdrawing twice is harmless.",
    )
    @action(detail=True, methods=["delete"], url_path=r"invitations/(?P<invitation_id>\d+)")
    def invitation(self, request, pk=None, invitation_id=None):
        tenant = self.get_object()
        self._require_admin(tenant)
        invitation = selectors.tenant_invitation(tenant=tenant, pk=int(invitation_id))
        services.invitation_revoke(invitation=invitation, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        methods=["PATCH"],
        request=MemberRoleSerializer,
        responses=MemberSerializer,
        description="Change a member's role (tenant admins). A tenant keeps one admin at least.",
    )
    @extend_schema(
        methods=["DELETE"],
        responses={204: OpenApiResponse(description="Removed; the account stays.")},
        description="Remove a member (tenant admins). Its last admin cannot be removed.",
    )
    @action(detail=True, methods=["patch", "delete"], url_path=r"members/(?P<membership_id>\d+)")
    def member(self, request, pk=None, membership_id=None):
        tenant = self.get_object()
        membership = selectors.tenant_member(tenant=tenant, pk=int(membership_id))
        self._require_admin(tenant)
        if request.method == "DELETE":
            services.member_remove(membership=membership, actor=request.user)
            return Response(status=status.HTTP_204_NO_CONTENT)
        data = MemberRoleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.member_set_role(
            membership=membership, role=data.validated_data["role"], actor=request.user
        )
        return Response(MemberSerializer(membership).data)

    def _require_admin(self, tenant: Tenant) -> None:
        tenant_change_check(self.request.user, tenant.pk)
        if selectors.viewer_role(tenant=tenant, user=self.request.user) != "admin":
            raise PermissionDenied("Only the tenant's admins manage its members.")


class TokenSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="Send it as `Authorization: Token <token>`.")


class ObtainTokenView(ObtainAuthToken):
    """Exchange a username and password for the user's API token (the same token every time,
    until it is deleted in the admin). Attempts are limited per client address
    (``API_TOKEN_RATE``), and wrong passwords count against the account with the sign-in
    forms' (``gpucap.tenancy.password_attempts``): a throttled account gets 429 here too."""

    # A login form needs no prior authentication, and no CSRF token from a session.
    authentication_classes = ()
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "token"
    # The API's own parsers, which refuse control characters (ObtainAuthToken names DRF's).
    parser_classes = api_settings.DEFAULT_PARSER_CLASSES
    schema = AutoSchema()

    @extend_schema(
        operation_id="token_create",
        request=AuthTokenSerializer,
        responses=TokenSerializer,
        auth=[],
        tags=["token"],
    )
    def post(self, request, *args, **kwargs):
        data = request.data if isinstance(request.data, Mapping) else {}
        account = str(data.get("username", ""))
        wait = password_attempts.wait_seconds(request=request._request, account=account)
        if wait:
            raise Throttled(wait=wait, detail=password_attempts.refusal(wait).messages[0])
        try:
            return super().post(request, *args, **kwargs)
        except ValidationError:
            password_attempts.attempt_record(request=request._request, account=account)
            raise
