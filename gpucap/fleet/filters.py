"""django-filter FilterSets for the fleet API's list endpoints; foreign keys filter by
id with the API's ``IdFilter``, yes/no questions with its strict ``BooleanFilter``."""

from gpucap.api.filters import BooleanFilter, FilterSet, IdFilter
from gpucap.fleet.models import CapacitySet, Cluster, Gpu, Image, Node, Pool


class ClusterFilter(FilterSet):
    class Meta:
        model = Cluster
        fields = {"name": ["exact"], "driver": ["exact"]}


class NodeFilter(FilterSet):
    cluster = IdFilter(field_name="cluster_id", label="Cluster id")
    capacity_set = IdFilter(field_name="capacity_set_id", label="Capacity set id")
    standalone = BooleanFilter(
        field_name="capacity_set", lookup_expr="isnull", label="In no capacity set"
    )
    dedicated_tenant = IdFilter(field_name="dedicated_tenant_id", label="Dedicated to tenant id")

    class Meta:
        model = Node
        fields = {
            "state": ["exact"],
            "gpu_model": ["exact"],
            "fabric": ["exact"],
            "hostname": ["exact", "icontains"],
        }


class GpuFilter(FilterSet):
    node = IdFilter(field_name="node_id", label="Node id")

    class Meta:
        model = Gpu
        fields = {"health": ["exact"]}


class CapacitySetFilter(FilterSet):
    cluster = IdFilter(field_name="cluster_id", label="Cluster id")

    class Meta:
        model = CapacitySet
        fields = {"fabric": ["exact"], "mode": ["exact"], "gpu_model": ["exact"]}


class PoolFilter(FilterSet):
    cluster = IdFilter(field_name="cluster_id", label="Cluster id")
    capacity_set = IdFilter(field_name="capacity_set_id", label="Capacity set id")
    standalone = BooleanFilter(
        field_name="capacity_set", lookup_expr="isnull", label="In no capacity set"
    )

    class Meta:
        model = Pool
        fields = {"kind": ["exact"], "gpu_model": ["exact"], "fabric": ["exact"]}


class ImageFilter(FilterSet):
    cluster = IdFilter(field_name="cluster_id", label="Cluster id")
    enabled = BooleanFilter(label="Offered to tenants")
    pool = IdFilter(field_name="cluster__pools", label="Pool id: the images of its cluster")

    class Meta:
        model = Image
        fields = {"name": ["exact"]}
