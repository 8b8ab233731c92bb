"""REST API for the fleet: clusters, nodes, GPUs, capacity sets and pools.

Reads are ModelViewSets over querysets written to a fixed number of queries, filtered with
django-filter. Every write (create, update, delete, and the commands: cordon, join a set,
re-rank, ...) goes through ``gpucap.fleet.services``; the input serializers here check only the
shape of a request, the services decide what is allowed. Fleet internals are operator-only;
tenant members may read the pools their tenants may use, and nothing else of the fleet.
"""

from django.db import transaction
from django.db.models import Count, Prefetch, Sum
from django.db.models.functions import Coalesce
from drf_spectacular.utils import (
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_view,
)
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from gpucap.api.base import InputSerializer, ServiceWrites, choice_field
from gpucap.api.permissions import IsOperator, IsOperatorOrReadOnly
from gpucap.fleet import selectors
from gpucap.fleet import services as fleet
from gpucap.fleet.filters import (
    CapacitySetFilter,
    ClusterFilter,
    GpuFilter,
    ImageFilter,
    NodeFilter,
    PoolFilter,
)
from gpucap.fleet.models import (
    CapacitySet,
    Cluster,
    Fabric,
    Gpu,
    Image,
    Node,
    Pool,
    validate_hostname,
)
from gpucap.fleet.rules import PROTECT_SECONDS_MAX
from gpucap.roles import is_operator, tenant_ids_for
from gpucap.tenancy.models import Tenant

PCI_ADDRESS = r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$"

# --- read serializers -------------------------------------------------------------------------


class NodeGpuSerializer(serializers.ModelSerializer):
    class Meta:
        model = Gpu
        fields = ["id", "index", "uuid", "pci_address", "module_id", "health"]
        read_only_fields = fields


class GpuSerializer(serializers.ModelSerializer):
    node_hostname = serializers.CharField(source="node.hostname", read_only=True)

    class Meta:
        model = Gpu
        fields = [
            "id",
            "node",
            "node_hostname",
            "index",
            "uuid",
            "pci_address",
            "module_id",
            "health",
        ]
        read_only_fields = fields


class NodeSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    capacity_set_name = serializers.CharField(
        source="capacity_set.name", read_only=True, allow_null=True
    )
    partitions = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField()),
        read_only=True,
        allow_null=True,
        help_text="NVSwitch partition table in GPU indices; null means the default table.",
    )
    fabric_partition_ids = serializers.ListField(
        child=serializers.IntegerField(allow_null=True),
        read_only=True,
        allow_null=True,
        help_text="Fabric Manager's partition id of each partition of the table, in the same "
        "order (manage.py fabric_partitions_import); null: not imported.",
    )
    labels = serializers.DictField(child=serializers.CharField(), read_only=True)
    gpus = NodeGpuSerializer(many=True, read_only=True)
    dedicated_tenant_slug = serializers.CharField(
        source="dedicated_tenant.slug",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The tenant the whole node is dedicated to (POST .../dedicate/); null: shared.",
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "capacity_set",
            "capacity_set_name",
            "hostname",
            "gpu_model",
            "fabric",
            "gpu_count",
            "state",
            "partitions",
            "fabric_partition_ids",
            "bmc_address",
            "labels",
            "guest_bridge",
            "guest_subnet",
            "dedicated_tenant",
            "dedicated_tenant_slug",
            "gpus",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class ClusterSerializer(serializers.ModelSerializer):
    driver_settings = serializers.DictField(read_only=True)
    node_count = serializers.IntegerField(read_only=True)
    gpu_total = serializers.IntegerField(read_only=True)
    capacity_sets = serializers.SlugRelatedField(many=True, read_only=True, slug_field="name")

    class Meta:
        model = Cluster
        fields = [
            "id",
            "name",
            "driver",
            "driver_settings",
            "node_count",
            "gpu_total",
            "capacity_sets",
            "created_at",
        ]
        read_only_fields = fields


class PolicyInForce(serializers.Serializer):
    """A pool's rank and floor as the arbiter uses them now: its own, unless its capacity set's
    schedule or an override holds others (gpucap/schedules)."""

    rank_in_force = serializers.IntegerField(
        read_only=True,
        help_text="The rank the arbiter uses now: rank, unless the capacity set's schedule or "
        "an override holds another.",
    )
    floor_gpus_in_force = serializers.IntegerField(
        source="floor_in_force",
        read_only=True,
        help_text="The floor the arbiter keeps now: floor_gpus, unless the capacity set's "
        "schedule or an override holds another.",
    )


class PoolSummarySerializer(PolicyInForce, serializers.ModelSerializer):
    class Meta:
        model = Pool
        fields = [
            "id",
            "name",
            "kind",
            "rank",
            "floor_gpus",
            "rank_in_force",
            "floor_gpus_in_force",
            "protect_seconds",
        ]
        read_only_fields = fields


class CapacitySetSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    node_count = serializers.IntegerField(read_only=True)
    gpu_total = serializers.IntegerField(read_only=True)
    pools = PoolSummarySerializer(
        many=True, read_only=True, help_text="The set's pools, highest priority (rank 1) first."
    )

    class Meta:
        model = CapacitySet
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "name",
            "gpu_model",
            "fabric",
            "mode",
            "notice_seconds",
            "generation",
            "node_count",
            "gpu_total",
            "pools",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class PoolSerializer(PolicyInForce, serializers.ModelSerializer):
    """A pool as operators see it."""

    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    capacity_set_name = serializers.CharField(
        source="capacity_set.name", read_only=True, allow_null=True
    )
    gpu_model = serializers.CharField(
        read_only=True,
        help_text="The GPUs the pool rents: its set's model, or for a standalone pool the model "
        "of the cluster's standalone nodes it places on.",
    )
    fabric = serializers.ChoiceField(
        choices=Fabric.choices,
        read_only=True,
        help_text="pcie or nvswitch: its set's fabric, or a standalone pool's own.",
    )
    tenants = serializers.SlugRelatedField(
        many=True, read_only=True, slug_field="slug", help_text="Tenants that may use the pool."
    )

    class Meta:
        model = Pool
        fields = [
            "id",
            "name",
            "kind",
            "cluster",
            "cluster_name",
            "capacity_set",
            "capacity_set_name",
            "gpu_model",
            "fabric",
            "rank",
            "floor_gpus",
            "rank_in_force",
            "floor_gpus_in_force",
            "protect_seconds",
            "tenants",
            "created_at",
        ]
        read_only_fields = fields


class TenantPoolSerializer(PoolSerializer):
    """A pool as a tenant member sees it: what it offers, not where it sits in the fleet.
    ``tenants`` lists only the member's own tenants."""

    class Meta(PoolSerializer.Meta):
        fields = ["id", "name", "kind", "gpu_model", "fabric", "tenants"]
        read_only_fields = fields


def _pool_as_seen(*, many: bool) -> PolymorphicProxySerializer:
    """For the schema: operators get a PoolSerializer, tenant members a TenantPoolSerializer."""
    return PolymorphicProxySerializer(
        component_name="PoolAsSeen",
        serializers=[PoolSerializer, TenantPoolSerializer],
        resource_type_field_name=None,
        many=many,
    )


class ImageSerializer(serializers.ModelSerializer):
    """A catalogue image as operators see it."""

    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    node_paths = serializers.DictField(
        child=serializers.CharField(),
        read_only=True,
        help_text="Per-node overrides of base_image: {hostname: path or volume name}.",
    )
    ports = serializers.ListField(
        child=serializers.IntegerField(),
        read_only=True,
        help_text="TCP ports a replica image serves; the first is the OpenAI endpoint.",
    )

    class Meta:
        model = Image
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "name",
            "base_image",
            "node_paths",
            "default_user",
            "ports",
            "health_path",
            "description",
            "enabled",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class TenantImageSerializer(ImageSerializer):
    """An image as a tenant member sees it: what to choose and how to log in, not where its
    files lie on the nodes."""

    class Meta(ImageSerializer.Meta):
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "name",
            "default_user",
            "ports",
            "health_path",
            "description",
        ]
        read_only_fields = fields


# --- input serializers: shapes only, the services decide --------------------------------------


class ClusterWriteSerializer(InputSerializer):
    name = serializers.SlugField(max_length=64)
    driver = choice_field(Cluster.Driver.choices, required=False)
    driver_settings = serializers.DictField(
        required=False, help_text="Driver-specific, e.g. a libvirt URI template."
    )


_MODULE_ID_HELP = (
    "Fabric Manager's module (physical) id of the card, 1..8 on an HGX baseboard: how its "
    "partition listing names the GPU. Null: not known."
)


class GpuInputSerializer(InputSerializer):
    index = serializers.IntegerField()
    uuid = serializers.CharField(max_length=64, required=False)
    pci_address = serializers.RegexField(
        PCI_ADDRESS,
        required=False,
        error_messages={"invalid": "must be a PCI address like 0000:18:00.0 (lower-case hex)"},
    )
    module_id = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text=_MODULE_ID_HELP,
    )
    health = choice_field(Gpu.Health.choices, required=False)


_GUEST_BRIDGE_HELP = (
    "The node's Linux bridge its guests' interfaces join (an interface name, e.g. gpubr0). "
    "Required with guest_subnet."
)
_GUEST_SUBNET_HELP = (
    "IPv4 subnet gpucap gives the node's guests addresses from (e.g. 10.200.0.0/24); its first "
    "address is the bridge's own, the guests' gateway. Blank: the node's driver gives guests "
    "addresses itself. No two nodes' subnets may overlap. Changes only while no VM holds GPUs "
    "on the node (409)."
)

_PARTITIONS_HELP = (
    "NVSwitch partition table as Fabric Manager lists it, in GPU indices, e.g. "
    "[[0,1,2,3,4,5,6,7],[0,1,2,3],[4,5,6,7],[0,2],[1,3],[4,6],[5,7],[0],...]. "
    "Null or absent: the default table for the node's GPU count."
)


class NodeCreateSerializer(InputSerializer):
    hints = {"state": "a new node starts ready; change it with the cordon/uncordon commands"}

    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all())
    hostname = serializers.CharField(max_length=253, validators=[validate_hostname])
    gpu_model = serializers.CharField(max_length=64)
    fabric = choice_field(Fabric.choices)
    gpu_count = serializers.IntegerField(help_text="1 to 8.")
    partitions = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField()),
        required=False,
        allow_null=True,
        help_text=_PARTITIONS_HELP,
    )
    bmc_address = serializers.CharField(max_length=253, required=False, allow_blank=True)
    labels = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)
    # Lengths and forms are the service's rules, so its reasons come back naming the field.
    guest_bridge = serializers.CharField(
        required=False, allow_blank=True, help_text=_GUEST_BRIDGE_HELP
    )
    guest_subnet = serializers.CharField(
        required=False, allow_blank=True, help_text=_GUEST_SUBNET_HELP
    )
    gpus = GpuInputSerializer(
        many=True,
        required=False,
        help_text="GPUs to register by index; any not listed get a generated UUID and PCI address.",
    )


class NodeUpdateSerializer(InputSerializer):
    hints = {
        "state": "change a node's state with the cordon/uncordon commands",
        "capacity_set": "move a node with the join-set/leave-set commands",
        "dedicated_tenant": "dedicate a node with POST /api/nodes/<id>/dedicate/, give it back "
        "with POST /api/nodes/<id>/release/",
    }

    partitions = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField()),
        required=False,
        allow_null=True,
        help_text=_PARTITIONS_HELP,
    )
    bmc_address = serializers.CharField(max_length=253, required=False, allow_blank=True)
    labels = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)
    # Lengths and forms are the service's rules, so its reasons come back naming the field.
    guest_bridge = serializers.CharField(
        required=False, allow_blank=True, help_text=_GUEST_BRIDGE_HELP
    )
    guest_subnet = serializers.CharField(
        required=False, allow_blank=True, help_text=_GUEST_SUBNET_HELP
    )


class CapacitySetCreateSerializer(InputSerializer):
    hints = {"mode": "a new capacity set always starts in dry_run"}

    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all())
    name = serializers.SlugField(max_length=64)
    gpu_model = serializers.CharField(max_length=64)
    fabric = choice_field(Fabric.choices)
    notice_seconds = serializers.IntegerField(
        required=False, help_text="Interruption notice, 1 to 86400 seconds (default 120)."
    )


class CapacitySetUpdateSerializer(InputSerializer):
    hints = {"mode": "switch the mode with POST /api/capacity-sets/{id}/mode/ (audited)"}

    notice_seconds = serializers.IntegerField(help_text="Interruption notice, 1 to 86400 seconds.")


def _protect_seconds_field() -> serializers.IntegerField:
    return serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=PROTECT_SECONDS_MAX,
        help_text="For this long after a VM of the pool starts or resumes, the arbiter does not "
        "reclaim it while any other plan serves the demand; a demand only such VMs could serve "
        "waits until their protection ends. 0 (default) is off; at most 604800 (7 days).",
    )


class PoolCreateSerializer(InputSerializer):
    name = serializers.SlugField(max_length=64)
    kind = choice_field(Pool.Kind.choices)
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all())
    capacity_set = serializers.PrimaryKeyRelatedField(
        queryset=CapacitySet.objects.all(),
        required=False,
        allow_null=True,
        help_text="Null or absent: a standalone pool on the cluster.",
    )
    gpu_model = serializers.CharField(
        max_length=64,
        required=False,
        help_text="Required for a standalone pool: the GPU model of the cluster's standalone "
        "nodes it places on. A pool in a set rents the set's model (absent or the same).",
    )
    fabric = choice_field(
        Fabric.choices,
        required=False,
        help_text="Required for a standalone pool: pcie or nvswitch. A pool in a set rents the "
        "set's fabric (absent or the same).",
    )
    rank = serializers.IntegerField(help_text="1 is the highest priority; unique within a set.")
    floor_gpus = serializers.IntegerField(
        required=False, help_text="GPUs the arbiter never reclaims this pool below (default 0)."
    )
    protect_seconds = _protect_seconds_field()


class PoolUpdateSerializer(InputSerializer):
    hints = {"rank": "re-rank a set's pools with the capacity set's rerank command"}

    floor_gpus = serializers.IntegerField(required=False)
    protect_seconds = _protect_seconds_field()
    tenants = serializers.SlugRelatedField(
        many=True,
        required=False,
        slug_field="slug",
        queryset=Tenant.objects.all(),
        help_text="Slugs of the tenants that may use the pool (replaces the list).",
    )


class _ImageFieldsSerializer(InputSerializer):
    base_image = serializers.CharField(
        max_length=500,
        help_text="The base image on the nodes: an absolute path or a storage volume name.",
    )
    node_paths = serializers.DictField(
        child=serializers.CharField(max_length=500),
        required=False,
        help_text="Per-node overrides of base_image: {hostname: path}; hostnames of the "
        "image's cluster.",
    )
    default_user = serializers.CharField(
        max_length=32, required=False, help_text="The login user, e.g. ubuntu (default root)."
    )
    ports = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        help_text="TCP ports a replica image serves; the first is the OpenAI endpoint.",
    )
    health_path = serializers.CharField(
        max_length=200, required=False, help_text="The replica readiness probe's path."
    )
    description = serializers.CharField(required=False, allow_blank=True)
    enabled = serializers.BooleanField(required=False, help_text="Offered to tenants.")


class ImageCreateSerializer(_ImageFieldsSerializer):
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all())
    name = serializers.CharField(
        max_length=64, help_text="What tenants choose, e.g. ubuntu-24.04-cuda-12.6."
    )


class ImageUpdateSerializer(_ImageFieldsSerializer):
    hints = {
        "cluster": "an image belongs to its cluster; create it on the other cluster instead",
        "name": "tenants' VMs name the image; create an image with the new name instead",
    }


class NodeJoinSetSerializer(InputSerializer):
    capacity_set = serializers.PrimaryKeyRelatedField(queryset=CapacitySet.objects.all())


class CapacitySetRerankSerializer(InputSerializer):
    pools = serializers.ListField(
        child=serializers.CharField(),
        allow_empty=True,
        help_text="Names of every pool of the set, highest priority first.",
    )


class PoolFloorSerializer(InputSerializer):
    floor_gpus = serializers.IntegerField()


class GpuHealthSerializer(InputSerializer):
    health = choice_field(Gpu.Health.choices)


class GpuModuleIdSerializer(InputSerializer):
    module_id = serializers.IntegerField(allow_null=True, help_text=_MODULE_ID_HELP)


# --- viewsets ---------------------------------------------------------------------------------


class FleetViewSet(ServiceWrites, viewsets.ModelViewSet):
    """CRUD over services. Subclasses set the input serializers and implement
    ``service_create``, ``service_update`` and ``service_delete``. PATCH only: every update
    is partial."""

    permission_classes = [IsOperator]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    create_serializer_class: type[InputSerializer]
    update_serializer_class: type[InputSerializer]

    def create(self, request, *args, **kwargs):
        data = self.validated(self.create_serializer_class, request.data)
        instance = self.service_create(data)
        return Response(self.read(instance), status=status.HTTP_201_CREATED)

    def partial_update(self, request, *args, **kwargs):
        instance = self.get_object()
        data = self.validated(self.update_serializer_class, request.data, partial=True)
        self.service_update(instance, data)
        return Response(self.read(instance))

    def perform_destroy(self, instance) -> None:
        self.service_delete(instance)

    def service_create(self, data: dict):
        raise NotImplementedError

    def service_update(self, instance, data: dict) -> None:
        raise NotImplementedError

    def service_delete(self, instance) -> None:
        raise NotImplementedError


def writes_schema(*, read, create, update, delete: str):
    """The OpenAPI description of a FleetViewSet's writes: input and output differ."""
    return extend_schema_view(
        create=extend_schema(request=create, responses={201: read}),
        partial_update=extend_schema(request=update, responses=read),
        destroy=extend_schema(description=delete),
    )


@writes_schema(
    read=ClusterSerializer,
    create=ClusterWriteSerializer,
    update=ClusterWriteSerializer,
    delete="Refused (409) while capacity sets, nodes or pools still belong to the cluster.",
)
class ClusterViewSet(FleetViewSet):
    """Clusters: groups of nodes under one VM driver. Operators only."""

    serializer_class = ClusterSerializer
    filterset_class = ClusterFilter
    create_serializer_class = ClusterWriteSerializer
    update_serializer_class = ClusterWriteSerializer

    def get_queryset(self):
        return selectors.clusters_with_totals()

    def service_create(self, data):
        return fleet.cluster_create(actor=self.request.user, **data)

    def service_update(self, cluster, data):
        with transaction.atomic():
            if "name" in data:
                cluster = fleet.cluster_rename(
                    cluster=cluster, name=data["name"], actor=self.request.user
                )
            if "driver" in data or "driver_settings" in data:
                fleet.cluster_update(
                    cluster=cluster,
                    driver=data.get("driver", cluster.driver),
                    driver_settings=data.get("driver_settings", cluster.driver_settings),
                    actor=self.request.user,
                )

    def service_delete(self, cluster):
        fleet.cluster_delete(cluster=cluster, actor=self.request.user)


@writes_schema(
    read=NodeSerializer,
    create=NodeCreateSerializer,
    update=NodeUpdateSerializer,
    delete="Deletes the node and its GPUs. Refused (409) while the node is in a capacity set.",
)
class NodeViewSet(FleetViewSet):
    """GPU servers with their cards. Operators only. A node's state and capacity set change
    only through the commands (cordon, uncordon, join-set, leave-set)."""

    serializer_class = NodeSerializer
    filterset_class = NodeFilter
    create_serializer_class = NodeCreateSerializer
    update_serializer_class = NodeUpdateSerializer

    def get_queryset(self):
        return Node.objects.select_related(
            "cluster", "capacity_set", "dedicated_tenant"
        ).prefetch_related("gpus")

    def service_create(self, data):
        return fleet.node_create(actor=self.request.user, **data)

    def service_update(self, node, data):
        fleet.node_update(node=node, actor=self.request.user, **data)

    def service_delete(self, node):
        fleet.node_delete(node=node, actor=self.request.user)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def cordon(self, request, pk=None):
        """Cordon a node: it keeps its VMs but takes no new placements."""
        node = self.get_object()
        fleet.node_cordon(node=node, actor=request.user)
        return Response(self.read(node))

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def uncordon(self, request, pk=None):
        """Make a cordoned node ready for placements again."""
        node = self.get_object()
        fleet.node_uncordon(node=node, actor=request.user)
        return Response(self.read(node))

    @extend_schema(request=NodeJoinSetSerializer, responses=NodeSerializer)
    @action(detail=True, methods=["post"], url_path="join-set")
    def join_set(self, request, pk=None):
        """Put the node into a capacity set of its own cluster, GPU model and fabric."""
        node = self.get_object()
        data = self.validated(NodeJoinSetSerializer, request.data)
        fleet.node_join_set(node=node, capacity_set=data["capacity_set"], actor=request.user)
        return Response(self.read(node))

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"], url_path="leave-set")
    def leave_set(self, request, pk=None):
        """Take the node out of its capacity set; refused (409) if the set's pools' floors
        would no longer fit."""
        node = self.get_object()
        fleet.node_leave_set(node=node, actor=request.user)
        return Response(self.read(node))


class GpuViewSet(ServiceWrites, viewsets.ReadOnlyModelViewSet):
    """GPUs: registered with their node, deleted with it. Operators only."""

    permission_classes = [IsOperator]
    serializer_class = GpuSerializer
    filterset_class = GpuFilter

    def get_queryset(self):
        return Gpu.objects.select_related("node")

    @extend_schema(request=GpuHealthSerializer, responses=GpuSerializer)
    @action(detail=True, methods=["post"])
    def health(self, request, pk=None):
        """Mark a GPU ok or failed; a failed GPU takes no placement."""
        gpu = self.get_object()
        data = self.validated(GpuHealthSerializer, request.data)
        fleet.gpu_set_health(gpu=gpu, health=data["health"], actor=request.user)
        return Response(self.read(gpu))

    @extend_schema(request=GpuModuleIdSerializer, responses=GpuSerializer)
    @action(detail=True, methods=["post"], url_path="module-id")
    def module_id(self, request, pk=None):
        """Set (or with null clear) the GPU's Fabric Manager module id; unique on its node."""
        gpu = self.get_object()
        data = self.validated(GpuModuleIdSerializer, request.data)
        gpu = fleet.gpu_set_module_id(gpu=gpu, module_id=data["module_id"], actor=request.user)
        return Response(self.read(gpu))


@writes_schema(
    read=CapacitySetSerializer,
    create=CapacitySetCreateSerializer,
    update=CapacitySetUpdateSerializer,
    delete="Refused (409) while nodes or pools still belong to the set.",
)
class CapacitySetViewSet(FleetViewSet):
    """Capacity sets: nodes of one cluster, GPU model and fabric, and the pools ranked in
    them. Operators only. A new set starts in dry_run."""

    serializer_class = CapacitySetSerializer
    filterset_class = CapacitySetFilter
    create_serializer_class = CapacitySetCreateSerializer
    update_serializer_class = CapacitySetUpdateSerializer

    def get_queryset(self):
        return (
            CapacitySet.objects.select_related("cluster")
            .annotate(node_count=Count("nodes"), gpu_total=Coalesce(Sum("nodes__gpu_count"), 0))
            .prefetch_related(Prefetch("pools", Pool.objects.order_by("rank")))
        )

    def service_create(self, data):
        return fleet.capacity_set_create(actor=self.request.user, **data)

    def service_update(self, capacity_set, data):
        if "notice_seconds" in data:
            fleet.capacity_set_update(
                capacity_set=capacity_set,
                notice_seconds=data["notice_seconds"],
                actor=self.request.user,
            )

    def service_delete(self, capacity_set):
        fleet.capacity_set_delete(capacity_set=capacity_set, actor=self.request.user)

    @extend_schema(request=CapacitySetRerankSerializer, responses=CapacitySetSerializer)
    @action(detail=True, methods=["post"])
    def rerank(self, request, pk=None):
        """Give the set's pools ranks 1..n in the order named, atomically. Every pool of the
        set must be named exactly once."""
        capacity_set = self.get_object()
        data = self.validated(CapacitySetRerankSerializer, request.data)
        fleet.pool_rerank(capacity_set=capacity_set, pool_names=data["pools"], actor=request.user)
        return Response(self.read(capacity_set))


@writes_schema(
    read=PoolSerializer,
    create=PoolCreateSerializer,
    update=PoolUpdateSerializer,
    delete="Deletes the pool; nothing else is touched.",
)
@extend_schema_view(
    list=extend_schema(responses=_pool_as_seen(many=True)),
    retrieve=extend_schema(responses=_pool_as_seen(many=False)),
)
class PoolViewSet(FleetViewSet):
    """Ranked consumers of capacity. Operators see and change every pool; a tenant member sees
    only the pools their tenants may use, with the GPU model and fabric they offer."""

    permission_classes = [IsOperatorOrReadOnly]
    filterset_class = PoolFilter
    create_serializer_class = PoolCreateSerializer
    update_serializer_class = PoolUpdateSerializer

    def get_queryset(self):
        pools = Pool.objects.select_related("cluster", "capacity_set")
        if self._sees_everything():
            return pools.prefetch_related("tenants")
        tenant_ids = tenant_ids_for(self.request.user)
        usable = Pool.tenants.through.objects.filter(tenant_id__in=tenant_ids)
        return pools.filter(pk__in=usable.values("pool_id")).prefetch_related(
            Prefetch("tenants", Tenant.objects.filter(pk__in=tenant_ids))
        )

    def get_serializer_class(self):
        return PoolSerializer if self._sees_everything() else TenantPoolSerializer

    def _sees_everything(self) -> bool:
        return getattr(self, "swagger_fake_view", False) or is_operator(self.request.user)

    def service_create(self, data):
        return fleet.pool_create(actor=self.request.user, **data)

    def service_update(self, pool, data):
        with transaction.atomic():
            if "floor_gpus" in data:
                fleet.pool_set_floor(
                    pool=pool, floor_gpus=data["floor_gpus"], actor=self.request.user
                )
            if "protect_seconds" in data:
                fleet.pool_set_protect(
                    pool=pool, protect_seconds=data["protect_seconds"], actor=self.request.user
                )
            if "tenants" in data:
                fleet.pool_set_tenants(pool=pool, tenants=data["tenants"], actor=self.request.user)

    def service_delete(self, pool):
        fleet.pool_delete(pool=pool, actor=self.request.user)

    @extend_schema(request=PoolFloorSerializer, responses=PoolSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def floor(self, request, pk=None):
        """Set the GPUs the arbiter never reclaims this pool below. The floors of a set's pools
        together may not exceed the set's GPUs."""
        pool = self.get_object()
        data = self.validated(PoolFloorSerializer, request.data)
        fleet.pool_set_floor(pool=pool, floor_gpus=data["floor_gpus"], actor=request.user)
        return Response(self.read(pool))


@writes_schema(
    read=ImageSerializer,
    create=ImageCreateSerializer,
    update=ImageUpdateSerializer,
    delete="Takes the image out of the catalogue; VMs that run it keep it. Disable it to stop "
    "offering it instead.",
)
@extend_schema_view(
    list=extend_schema(
        responses=PolymorphicProxySerializer(
            component_name="ImageAsSeen",
            serializers=[ImageSerializer, TenantImageSerializer],
            resource_type_field_name=None,
            many=True,
        )
    ),
    retrieve=extend_schema(
        responses=PolymorphicProxySerializer(
            component_name="ImageAsSeen",
            serializers=[ImageSerializer, TenantImageSerializer],
            resource_type_field_name=None,
            many=False,
        )
    ),
)
class ImageViewSet(FleetViewSet):
    """The image catalogue. Operators see and change every image; a tenant member sees the
    enabled images of the clusters of the pools their tenants may use (what they may choose
    when they ask for a VM)."""

    permission_classes = [IsOperatorOrReadOnly]
    filterset_class = ImageFilter
    create_serializer_class = ImageCreateSerializer
    update_serializer_class = ImageUpdateSerializer

    def get_queryset(self):
        images = Image.objects.select_related("cluster")
        if self._sees_everything():
            return images
        usable = Pool.tenants.through.objects.filter(
            tenant_id__in=tenant_ids_for(self.request.user)
        )
        return images.filter(enabled=True, cluster_id__in=usable.values("pool__cluster_id"))

    def get_serializer_class(self):
        return ImageSerializer if self._sees_everything() else TenantImageSerializer

    def _sees_everything(self) -> bool:
        return getattr(self, "swagger_fake_view", False) or is_operator(self.request.user)

    def service_create(self, data):
        return fleet.image_create(actor=self.request.user, **data)

    def service_update(self, image, data):
        fleet.image_update(image=image, actor=self.request.user, **data)

    def service_delete(self, image):
        fleet.image_delete(image=image, actor=self.request.user)
