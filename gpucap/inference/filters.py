"""django-filter FilterSets for the inference API. Every filter narrows what the user may
already see: a member filtering by another tenant's slug gets an empty list, not a hint that
the tenant exists."""

import django_filters

from gpucap.api.filters import BooleanFilter, FilterSet, IdFilter
from gpucap.inference.models import ApiKey, InferenceDeployment


class InferenceDeploymentFilter(FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug", label="Tenant slug")
    pool = IdFilter(field_name="pool_id", label="Pool id")

    class Meta:
        model = InferenceDeployment
        fields = {"name": ["exact"], "slug": ["exact"], "model_name": ["exact"]}


class ApiKeyFilter(FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug", label="Tenant slug")
    deployment = IdFilter(field_name="deployment_id", label="Deployment id")
    all_deployments = BooleanFilter(
        field_name="deployment",
        lookup_expr="isnull",
        label="Keys that open every deployment of their tenant",
    )
    revoked = BooleanFilter(
        field_name="revoked_at", lookup_expr="isnull", exclude=True, label="Revoked"
    )

    class Meta:
        model = ApiKey
        fields = {"prefix": ["exact"]}
