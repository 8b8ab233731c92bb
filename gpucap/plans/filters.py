"""django-filter FilterSet for the plans API's list endpoint."""

import django_filters

from gpucap.api.filters import FilterSet, IdFilter
from gpucap.plans.models import Plan


class PlanFilter(FilterSet):
    capacity_set = IdFilter(field_name="capacity_set_id", label="Capacity set id")
    capacity_set_name = django_filters.CharFilter(
        field_name="capacity_set__name", label="Capacity set name"
    )

    class Meta:
        model = Plan
        fields = {"status": ["exact"]}
