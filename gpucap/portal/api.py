"""The tenants API as it is served: tenancy's (tenants, members, invitations) with the pools each
tenant may use, a fleet model, which tenancy sits below."""

from django.db.models import Prefetch
from rest_framework import serializers

from gpucap.fleet.models import Pool
from gpucap.tenancy import api as tenancy


class TenantSerializer(tenancy.TenantSerializer):
    pools = serializers.SlugRelatedField(
        many=True, read_only=True, slug_field="name", help_text="Pools the tenant may use."
    )

    class Meta(tenancy.TenantSerializer.Meta):
        fields = ["id", "name", "slug", "pools", "created_at"]
        read_only_fields = fields


class TenantViewSet(tenancy.TenantViewSet):
    __doc__ = tenancy.TenantViewSet.__doc__
    serializer_class = TenantSerializer

    def get_queryset(self):
        return self.visible(
            tenancy.Tenant.objects.prefetch_related(
                Prefetch("pools", Pool.objects.only("name").order_by("name"))
            )
        )
