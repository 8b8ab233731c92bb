"""REST API for notices, drains and reclaims.

``/api/notices/`` is tenant-scoped: a member reads the notices of their own tenants' VMs (another
tenant's notice id answers 404), operators read all. Draining a node or a capacity set and
reclaiming a VM are operator commands: one small view each, calling
``gpucap.notices.drains``; a drain answers with the node and who still holds it up.
"""

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, viewsets
from rest_framework.response import Response

from gpucap.api.base import InputSerializer, OperatorCommand
from gpucap.api.filters import BooleanFilter, FilterSet, IdFilter
from gpucap.api.schema import AutoSchema
from gpucap.fleet.models import CapacitySet, Node
from gpucap.notices import drains, selectors
from gpucap.notices.models import InterruptionNotice
from gpucap.rentals.models import VirtualMachine
from gpucap.roles import is_operator

# --- read -------------------------------------------------------------------------------------


class NoticeSerializer(serializers.ModelSerializer):
    instance_id = serializers.CharField(source="vm.instance_id", read_only=True)
    vm_name = serializers.CharField(source="vm.name", read_only=True)
    tenant = serializers.CharField(source="vm.tenant.slug", read_only=True)
    pool_name = serializers.CharField(source="vm.pool.name", read_only=True)
    node_hostname = serializers.CharField(
        source="vm.node.hostname", read_only=True, allow_null=True, default=None
    )
    issued_by = serializers.CharField(
        source="issued_by.username",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The operator who issued it; null for the arbiter and the system.",
    )
    is_open = serializers.BooleanField(read_only=True)
    # Declared so that "" (still open) is documented: a read-only model field loses blank.
    outcome = serializers.ChoiceField(
        choices=InterruptionNotice.Outcome.choices,
        allow_blank=True,
        read_only=True,
        help_text="How the notice ended; empty while it is open.",
    )
    message = serializers.SerializerMethodField(
        help_text="Why, in words. Operators read the full reason (the arbiter's names the VM "
        "and pool it reclaims for); a tenant's member reads it naming only their own resources."
    )
    seconds_left = serializers.SerializerMethodField(
        help_text="Whole seconds until the deadline (0 once it passed); null once closed."
    )

    class Meta:
        model = InterruptionNotice
        fields = [
            "id",
            "vm",
            "instance_id",
            "vm_name",
            "tenant",
            "pool_name",
            "node_hostname",
            "reason",
            "message",
            "issued_at",
            "deadline",
            "seconds_left",
            "issued_by",
            "acknowledged_at",
            "completed_at",
            "outcome",
            "is_open",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField())
    def get_message(self, notice: InterruptionNotice) -> str:
        request = self.context.get("request")
        if request is not None and is_operator(request.user):
            return notice.message
        return notice.tenant_message

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_seconds_left(self, notice: InterruptionNotice) -> int | None:
        if not notice.is_open:
            return None
        return max(0, int((notice.deadline - timezone.now()).total_seconds()))


class NoticeFilter(FilterSet):
    open = BooleanFilter(
        field_name="completed_at", lookup_expr="isnull", label="Open (not yet completed)"
    )
    vm = IdFilter(field_name="vm_id", label="VM id")

    class Meta:
        model = InterruptionNotice
        fields = {"reason": ["exact"]}


class NoticeViewSet(viewsets.ReadOnlyModelViewSet):
    """Interruption notices: those of a member's own tenants' VMs; all for operators."""

    schema = AutoSchema()
    serializer_class = NoticeSerializer
    filterset_class = NoticeFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return selectors.notices_with_vms()
        return selectors.notices_visible_to(self.request.user).order_by("-issued_at", "-id")


class DrainBlockerSerializer(serializers.Serializer):
    vm = serializers.IntegerField(source="vm.pk")
    instance_id = serializers.CharField(source="vm.instance_id")
    vm_name = serializers.CharField(source="vm.name")
    tenant = serializers.CharField(source="vm.tenant.slug")
    pool_name = serializers.CharField(source="vm.pool.name")
    pool_kind = serializers.CharField(source="vm.pool.kind", help_text="on_demand, spot, ...")
    state = serializers.CharField(source="vm.state")
    waiting_for = serializers.ChoiceField(
        choices=["on_demand", "notice", "stopping", "starting"],
        help_text="on_demand: a drain never stops it, it waits for the owner; notice: stops at "
        "the deadline; stopping: shutting down; starting: still booting, warned once running.",
    )
    explanation = serializers.CharField()
    since = serializers.DateTimeField(help_text="Holding the node's GPUs since.")
    deadline = serializers.DateTimeField(source="notice.deadline", allow_null=True, default=None)


class DrainSerializer(serializers.Serializer):
    node = serializers.IntegerField(source="node.pk")
    hostname = serializers.CharField(source="node.hostname")
    state = serializers.CharField(
        source="node.state", help_text="draining, or cordoned once no VM holds it"
    )
    blockers = DrainBlockerSerializer(many=True, help_text="VMs still holding the node.")


def _drain(node: Node) -> dict:
    return {"node": node, "blockers": selectors.drain_blockers(node)}


class CapacitySetDrainSerializer(serializers.Serializer):
    capacity_set = serializers.IntegerField(source="capacity_set.pk")
    name = serializers.CharField(source="capacity_set.name")
    nodes = DrainSerializer(many=True)


class ReclaimSerializer(InputSerializer):
    message = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=500,
        help_text="Why, in words: the tenant sees it with the notice.",
    )


# --- commands ---------------------------------------------------------------------------------


class NodeDrainView(OperatorCommand):
    @extend_schema(request=None, responses=DrainSerializer, operation_id="nodes_drain_create")
    def post(self, request, id: int):
        """Drain a node: it takes no new placements, its spot VMs and inference replicas get a
        drain notice, on-demand VMs are waited for (listed in `blockers`); it ends cordoned
        once empty. Draining a down node is refused (409). Cancel with uncordon."""
        node = get_object_or_404(Node, pk=id)
        node = drains.node_drain(node=node, actor=request.user)
        return Response(DrainSerializer(_drain(node)).data)


class NodeDrainBlockersView(OperatorCommand):
    @extend_schema(responses=DrainSerializer, operation_id="nodes_drain_blockers_retrieve")
    def get(self, request, id: int):
        """Who holds a node up: every VM still holding its GPUs and what the drain waits for."""
        node = get_object_or_404(Node, pk=id)
        return Response(DrainSerializer(_drain(node)).data)


class CapacitySetDrainView(OperatorCommand):
    @extend_schema(
        request=None,
        responses=CapacitySetDrainSerializer,
        operation_id="capacity_sets_drain_create",
    )
    def post(self, request, id: int):
        """Drain every node of a capacity set (down nodes are left as they are)."""
        capacity_set = get_object_or_404(CapacitySet, pk=id)
        nodes = drains.capacity_set_drain(capacity_set=capacity_set, actor=request.user)
        body = {"capacity_set": capacity_set, "nodes": [_drain(node) for node in nodes]}
        return Response(CapacitySetDrainSerializer(body).data)


class VmReclaimView(OperatorCommand):
    @extend_schema(
        request=ReclaimSerializer, responses=NoticeSerializer, operation_id="vms_reclaim_create"
    )
    def post(self, request, id: int):
        """Reclaim one rental: a reclaim notice now, a stop at its deadline (on-demand VMs
        included). Only a running VM can be reclaimed (409 otherwise); a VM with an open
        notice keeps it and its deadline."""
        vm = get_object_or_404(VirtualMachine, pk=id)
        serializer = ReclaimSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        notice = drains.vm_reclaim(
            vm=vm, actor=request.user, message=serializer.validated_data.get("message", "")
        )
        return Response(
            NoticeSerializer(
                selectors.notices_with_vms().get(pk=notice.pk), context={"request": request}
            ).data
        )
