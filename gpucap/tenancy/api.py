"""REST API for tenancy: the tenants a user may see, and API tokens.

Operators see every tenant; a member sees only the tenants they belong to, and another
tenant's id answers 404, as if it did not exist.
"""

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.authtoken.views import ObtainAuthToken

from gpucap.api import AutoSchema
from gpucap.fleet.models import Pool
from gpucap.tenancy.models import Tenant
from gpucap.tenancy.roles import is_operator, tenant_ids_for


class TenantSerializer(serializers.ModelSerializer):
    pools = serializers.SlugRelatedField(
        many=True, read_only=True, slug_field="name", help_text="Pools the tenant may use."
    )

    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "pools", "created_at"]
        read_only_fields = fields


class TenantViewSet(viewsets.ReadOnlyModelViewSet):
    """Tenants: every tenant for operators, a member's own tenants for everyone else."""

    schema = AutoSchema()
    serializer_class = TenantSerializer
    filterset_fields = ["slug"]

    def get_queryset(self):
        tenants = Tenant.objects.prefetch_related(
            Prefetch("pools", Pool.objects.only("name").order_by("name"))
        )
        if getattr(self, "swagger_fake_view", False) or is_operator(self.request.user):
            return tenants
        return tenants.filter(pk__in=tenant_ids_for(self.request.user))


class TokenSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="Send it as `Authorization: Token <token>`.")


class ObtainTokenView(ObtainAuthToken):
    """Exchange a username and password for the user's API token (the same token every time,
    until it is deleted in the admin)."""

    # A login form needs no prior authentication, and no CSRF token from a session.
    authentication_classes = ()
    schema = AutoSchema()

    @extend_schema(
        operation_id="token_create",
        request=AuthTokenSerializer,
        responses=TokenSerializer,
        auth=[],
        tags=["token"],
    )
    def post(self, request, *args, **kwargs):
        return super().post(request, *args, **kwargs)
