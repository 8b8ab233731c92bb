"""The quotas list's filters: foreign keys by id (the API's ``IdFilter``)."""

from gpucap.allocation.models import TenantQuota
from gpucap.api.filters import FilterSet, IdFilter


class TenantQuotaFilter(FilterSet):
    tenant = IdFilter(field_name="tenant_id", label="Tenant id")
    pool = IdFilter(field_name="pool_id", label="Pool id")

    class Meta:
        model = TenantQuota
        fields = {"gpu_model": ["exact"]}
