"""The tenants API as it is served: tenancy's (tenants, members, invitations) with the pools each
tenant may use, a fleet model, which tenancy sits below."""

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.response import Response

from gpucap.fleet.models import Pool
from gpucap.portal import selectors
from gpucap.tenancy import api as tenancy


class TenantSerializer(tenancy.TenantSerializer):
    pools = serializers.SlugRelatedField(
        many=True, read_only=True, slug_field="name", help_text="Pools the tenant may use."
    )

    class Meta(tenancy.TenantSerializer.Meta):
        fields = ["id", "name", "slug", "pools", "created_at"]
        read_only_fields = fields


class DedicatedVmSerializer(serializers.Serializer):
    id = serializers.IntegerField(source="pk")
    instance_id = serializers.CharField()
    name = serializers.CharField()
    state = serializers.CharField()
    pool_name = serializers.CharField(source="pool.name")
    gpu_count = serializers.IntegerField()


class DedicatedNodeSerializer(serializers.Serializer):
    hostname = serializers.CharField(source="node.hostname")
    cluster_name = serializers.CharField(source="node.cluster.name")
    capacity_set_name = serializers.CharField(
        source="node.capacity_set.name", allow_null=True, default=None
    )
    gpu_model = serializers.CharField(source="node.gpu_model")
    gpu_count = serializers.IntegerField(source="node.gpu_count")
    free_gpus = serializers.IntegerField(help_text="GPUs no VM holds now.")
    vms = DedicatedVmSerializer(many=True, help_text="The tenant's VMs holding GPUs there.")
    others_leaving = serializers.IntegerField(
        help_text="Other tenants' VMs still on the node, leaving (a dedication waits for them)."
    )
    bare_metal_rental = serializers.IntegerField(
        source="rental_id",
        allow_null=True,
        help_text="The node is rented to the tenant whole: the rental's id "
        "(/api/bare-metal/<id>/); null: it is not.",
    )


class TenantViewSet(tenancy.TenantViewSet):
    __doc__ = tenancy.TenantViewSet.__doc__
    serializer_class = TenantSerializer

    def get_queryset(self):
        return self.visible(
            tenancy.Tenant.objects.prefetch_related(
                Prefetch("pools", Pool.objects.only("name").order_by("name"))
            )
        )

    @extend_schema(
        responses=DedicatedNodeSerializer(many=True),
        description="The whole nodes dedicated to the tenant (only its VMs are placed there), "
        "with the tenant's VMs on each. Other tenants' VMs still leaving a node are counted, "
        "never named.",
    )
    @action(
        detail=True,
        methods=["get"],
        url_path="dedicated-nodes",
        pagination_class=None,
        filter_backends=[],
    )
    def dedicated_nodes(self, request, pk=None):
        tenant = self.get_object()
        nodes = selectors.dedicated_nodes(tenant=tenant)
        return Response(DedicatedNodeSerializer(nodes, many=True).data)
