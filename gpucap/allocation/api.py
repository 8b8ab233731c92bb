"""REST API for tenant quotas (issue #19).

- ``GET /api/quotas/`` lists quotas with their use now: operators see every tenant's, a tenant
  member only their own tenants' (read-only). ``GET /api/quotas/{id}/`` is one; another
  tenant's quota is a 404, as if it did not exist.
- ``POST /api/quotas/`` (operators) sets a tenant's quota (``tenant``: its slug) in a scope:
  ``pool`` (an id) or ``gpu_model``, exactly one. It creates the quota (201) or changes the
  one the tenant has there (200). ``PATCH /api/quotas/{id}/`` changes ``max_gpus`` or
  ``max_pending``; ``DELETE`` removes it. Each answer carries ``note``: what a quota below
  current use means (nothing is stopped; new requests are refused until the use is below).

Bad input is a 400 naming the field, in the API's one error shape, and changes nothing.
"""

from django.core.exceptions import ValidationError
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.response import Response

from gpucap.allocation import services
from gpucap.allocation.filters import TenantQuotaFilter
from gpucap.allocation.models import TenantQuota
from gpucap.allocation.selectors import QuotaUse, quota_uses
from gpucap.api.base import InputSerializer, ServiceWrites
from gpucap.api.filters import MAX_ID
from gpucap.api.permissions import IsOperatorOrReadOnly
from gpucap.fleet.models import Pool
from gpucap.roles import is_operator, tenant_ids_for
from gpucap.tenancy.models import Tenant


class QuotaUseSerializer(serializers.Serializer):
    held_gpus = serializers.IntegerField(
        help_text="GPUs of VMs provisioning, running, notified or stopping in the scope."
    )
    pending_gpus = serializers.IntegerField(help_text="GPUs of requests waiting in the scope.")
    pending = serializers.IntegerField(help_text="Requests waiting in the scope.")
    held_vms = serializers.ListField(child=serializers.CharField(), help_text="Their names.")
    pending_vms = serializers.ListField(child=serializers.CharField(), help_text="Their names.")


class TenantQuotaSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool_name = serializers.CharField(
        source="pool.name", read_only=True, default=None, allow_null=True
    )
    use = serializers.SerializerMethodField()
    note = serializers.SerializerMethodField()

    class Meta:
        model = TenantQuota
        fields = [
            "id",
            "tenant",
            "pool",
            "pool_name",
            "gpu_model",
            "max_gpus",
            "max_pending",
            "use",
            "note",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(QuotaUseSerializer)
    def get_use(self, quota) -> dict:
        return QuotaUseSerializer(self._use(quota)).data

    def get_note(self, quota) -> str:
        """Set when the tenant uses more than the quota allows: nothing is stopped."""
        return services.below_use_note(quota, self._use(quota))

    def _use(self, quota) -> QuotaUse:
        uses = self.context.setdefault("uses", {})
        if quota.pk not in uses:
            uses.update(quota_uses([quota]))
        return uses[quota.pk]


class QuotaSetSerializer(InputSerializer):
    tenant = serializers.CharField(max_length=64, help_text="The tenant's slug.")
    pool = serializers.IntegerField(
        min_value=1,
        max_value=MAX_ID,
        required=False,
        allow_null=True,
        help_text="Pool id: the quota binds this pool. Give this or gpu_model.",
    )
    gpu_model = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=64,
        help_text="GPU model: the quota binds every pool of it, in every capacity set.",
    )
    max_gpus = serializers.IntegerField(
        help_text="The most GPUs held plus pending in the scope (0 or more)."
    )
    max_pending = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="The most requests waiting in the scope (0 or more); null: no limit.",
    )


class QuotaChangeSerializer(InputSerializer):
    max_gpus = serializers.IntegerField(required=False)
    max_pending = serializers.IntegerField(required=False, allow_null=True)


@extend_schema_view(
    create=extend_schema(
        request=QuotaSetSerializer,
        responses={200: TenantQuotaSerializer, 201: TenantQuotaSerializer},
    ),
    partial_update=extend_schema(request=QuotaChangeSerializer, responses=TenantQuotaSerializer),
    destroy=extend_schema(
        description="Remove the quota; the tenant's requests in its scope are no longer limited."
    ),
)
class TenantQuotaViewSet(ServiceWrites, viewsets.ModelViewSet):
    """Tenants' quotas with their use. Operators set them; a tenant member reads its own."""

    permission_classes = [IsOperatorOrReadOnly]
    serializer_class = TenantQuotaSerializer
    filterset_class = TenantQuotaFilter
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        quotas = TenantQuota.objects.select_related("tenant", "pool")
        if getattr(self, "swagger_fake_view", False) or is_operator(self.request.user):
            return quotas
        return quotas.filter(tenant_id__in=tenant_ids_for(self.request.user))

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        context = {**self.get_serializer_context(), "uses": quota_uses(page)}
        data = TenantQuotaSerializer(page, many=True, context=context).data
        return self.get_paginated_response(data)

    def create(self, request, *args, **kwargs):
        data = self.validated(QuotaSetSerializer, request.data)
        errors = {}
        tenant = Tenant.objects.filter(slug=data["tenant"]).first()
        if tenant is None:
            errors["tenant"] = f"no tenant is called {data['tenant']!r}"
        pool = None
        if data.get("pool") is not None:
            pool = Pool.objects.filter(pk=data["pool"]).first()
            if pool is None:
                errors["pool"] = f"no pool has id {data['pool']}"
        if errors:
            raise ValidationError(errors)
        saved = services.quota_set(
            tenant=tenant,
            pool=pool,
            gpu_model=data.get("gpu_model", ""),
            max_gpus=data["max_gpus"],
            max_pending=data.get("max_pending"),
            actor=request.user,
        )
        return Response(
            self.read(saved.quota),
            status=status.HTTP_201_CREATED if saved.created else status.HTTP_200_OK,
        )

    def partial_update(self, request, *args, **kwargs):
        quota = self.get_object()
        data = self.validated(QuotaChangeSerializer, request.data)
        saved = services.quota_set(
            tenant=quota.tenant,
            pool=quota.pool,
            gpu_model=quota.gpu_model,
            max_gpus=data.get("max_gpus", quota.max_gpus),
            max_pending=data.get("max_pending", quota.max_pending),
            actor=request.user,
        )
        return Response(self.read(saved.quota))

    def perform_destroy(self, instance) -> None:
        services.quota_delete(quota=instance, actor=self.request.user)
