"""REST API for dedicated nodes (`gpucap.notices.dedications`): operator commands that dedicate
a node to a tenant (previewed with ``dry_run``, then applied) and release it. A tenant reads its
dedicated nodes on ``/api/tenants/<id>/dedicated-nodes/`` (gpucap.portal.api)."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from gpucap.api.base import InputSerializer, OperatorCommand
from gpucap.fleet.models import Node
from gpucap.notices import dedications
from gpucap.notices.api import DrainBlockerSerializer
from gpucap.tenancy.models import Tenant


class DedicateSerializer(InputSerializer):
    tenant = serializers.PrimaryKeyRelatedField(
        queryset=Tenant.objects.all(),
        help_text="The tenant the whole node is given to.",
        error_messages={"does_not_exist": "no tenant has id {pk_value}"},
    )
    dry_run = serializers.BooleanField(
        required=False,
        default=True,
        help_text="true (the default): only say what dedicating would do; false: do it.",
    )


class NoticedVmSerializer(serializers.Serializer):
    vm = serializers.IntegerField(source="pk")
    instance_id = serializers.CharField()
    vm_name = serializers.CharField(source="name")
    tenant = serializers.CharField(source="tenant.slug")
    pool_name = serializers.CharField(source="pool.name")
    pool_kind = serializers.CharField(source="pool.kind", help_text="spot or inference")


class DedicationSerializer(serializers.Serializer):
    node = serializers.IntegerField(source="node.pk")
    hostname = serializers.CharField(source="node.hostname")
    tenant = serializers.IntegerField(source="tenant.pk")
    tenant_slug = serializers.CharField(source="tenant.slug")
    dry_run = serializers.SerializerMethodField(
        help_text="true: a preview, nothing changed; false: the node is dedicated now."
    )
    complete = serializers.BooleanField(
        help_text="No other tenant's VM is left on the node: nobody gets a notice or holds it up."
    )
    notices = NoticedVmSerializer(
        many=True,
        help_text="Other tenants' running spot VMs and inference replicas that get (dry run: "
        "would get) a drain notice with the set's notice_seconds now. Empty on a second apply.",
    )
    holders = DrainBlockerSerializer(
        many=True,
        help_text="Other tenants' VMs that hold the node up: on-demand VMs (never stopped, "
        "waited for), VMs under notice or stopping, VMs still booting (warned once running).",
    )

    def get_dry_run(self, dedication) -> bool:
        return not dedication.applied


class ReleaseSerializer(serializers.Serializer):
    node = serializers.IntegerField(source="pk")
    hostname = serializers.CharField()
    dedicated_tenant = serializers.IntegerField(
        source="dedicated_tenant_id", allow_null=True, help_text="null: shared again."
    )


class NodeDedicateView(OperatorCommand):
    @extend_schema(
        request=DedicateSerializer,
        responses=DedicationSerializer,
        operation_id="nodes_dedicate_create",
    )
    def post(self, request, id: int):
        """Dedicate a whole node to one tenant: only its VMs are placed there from then on, and
        the node is no free capacity for anyone else. Other tenants' spot VMs and inference
        replicas on it get a drain notice; their on-demand VMs are never stopped and hold the
        node up until they leave (`holders`). With `dry_run` (the default) nothing changes.
        Applying twice sends no second notice. A node dedicated to another tenant is a 409
        naming it."""
        node = get_object_or_404(Node, pk=id)
        data = DedicateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = data.validated_data["tenant"]
        if data.validated_data["dry_run"]:
            result = dedications.node_dedicate_preview(node=node, tenant=tenant)
        else:
            result = dedications.node_dedicate(node=node, tenant=tenant, actor=request.user)
        return Response(DedicationSerializer(result).data)


class NodeReleaseView(OperatorCommand):
    @extend_schema(request=None, responses=ReleaseSerializer, operation_id="nodes_release_create")
    def post(self, request, id: int):
        """Give a dedicated node back to the shared pool: its free GPUs are free capacity for
        every tenant again; its tenant's VMs keep running. A shared node is a 409."""
        node = get_object_or_404(Node, pk=id)
        node = dedications.node_release(node=node, actor=request.user)
        return Response(ReleaseSerializer(node).data)
