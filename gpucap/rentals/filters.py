"""django-filter FilterSets for the VM API. Every filter narrows the VMs the user may already
see: a member filtering by another tenant's slug gets an empty list, not a hint that it exists."""

import django_filters

from gpucap.api.filters import FilterSet, IdFilter
from gpucap.rentals.models import VirtualMachine


class VirtualMachineFilter(FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug", label="Tenant slug")
    pool = IdFilter(field_name="pool_id", label="Pool id")
    job = django_filters.CharFilter(field_name="job", label="Job name (the VMs of a multi-VM job)")
    node = IdFilter(field_name="node_id", label="Node id (where the VM holds or last held GPUs)")

    class Meta:
        model = VirtualMachine
        fields = {"state": ["exact"], "role": ["exact"]}
