"""REST API of a node's provisioning by virtual media (docs/bmc.md), operators only:
``POST /api/nodes/{id}/provisioning/`` starts a run, ``GET`` the same path reads the node's
runs. The BMC calls run in Celery tasks; these views only record the request and read progress.
(Discoveries and credentials are ``gpucap.bmc.api``.)"""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from gpucap.api.base import InputSerializer, OperatorCommand
from gpucap.bmc import provisioning
from gpucap.bmc.models import Provisioning
from gpucap.bmc.selectors import HISTORY, provisioning_steps, provisionings_of
from gpucap.fleet.models import Node


class ProvisionSerializer(InputSerializer):
    image_url = serializers.CharField(
        max_length=provisioning.IMAGE_URL_MAX_LENGTH,
        allow_blank=True,
        trim_whitespace=False,
        help_text="An http:// or https:// URL of the installer or OS image (an ISO) the node's "
        "BMC fetches and boots from.",
    )


class ProvisioningStepSerializer(serializers.Serializer):
    state = serializers.CharField(help_text="inserting, booting, waiting, then done or failed")
    label = serializers.CharField()
    at = serializers.DateTimeField(allow_null=True, help_text="When the step began; null: not yet.")
    status = serializers.ChoiceField(choices=["done", "current", "failed", "pending"])


class ProvisioningSerializer(serializers.ModelSerializer):
    hostname = serializers.CharField(source="node.hostname")
    in_progress = serializers.BooleanField()
    requested_by = serializers.SerializerMethodField(help_text="Who asked (null: nobody left).")
    steps = serializers.SerializerMethodField()

    class Meta:
        model = Provisioning
        fields = [
            "id",
            "node",
            "hostname",
            "image_url",
            "state",
            "in_progress",
            "requested_by",
            "started_at",
            "deadline",
            "inserted_at",
            "reset_at",
            "reset_type",
            "answered_at",
            "finished_at",
            "message",
            "steps",
        ]

    def get_requested_by(self, run) -> str | None:
        return run.requested_by.get_username() if run.requested_by else None

    @extend_schema(responses=ProvisioningStepSerializer(many=True))
    def get_steps(self, run) -> list[dict]:
        return ProvisioningStepSerializer(provisioning_steps(run), many=True).data


class NodeProvisioningSerializer(serializers.Serializer):
    node = serializers.IntegerField(source="node.pk")
    hostname = serializers.CharField(source="node.hostname")
    in_progress = serializers.BooleanField(help_text="A run is in progress (the newest one).")
    runs = ProvisioningSerializer(
        many=True, help_text=f"The node's runs, newest first (at most {HISTORY})."
    )


class NodeProvisioningView(OperatorCommand):
    @extend_schema(responses=NodeProvisioningSerializer, operation_id="nodes_provisioning_retrieve")
    def get(self, request, id: int):
        """A node's provisioning by virtual media: its runs, newest first, each with its state,
        its steps with their times, and what happened (`message`)."""
        node = get_object_or_404(Node, pk=id)
        runs = provisionings_of(node)
        body = {"node": node, "in_progress": bool(runs) and runs[0].in_progress, "runs": runs}
        return Response(NodeProvisioningSerializer(body).data)

    @extend_schema(
        request=ProvisionSerializer,
        responses={201: ProvisioningSerializer},
        operation_id="nodes_provisioning_create",
    )
    def post(self, request, id: int):
        """Boot a node from an installer or OS image by its BMC's virtual media: the image is
        inserted in the BMC's CD/DVD drive, the next boot set to it once, the machine reset
        (ForceRestart, or On when off), then gpucap waits for the node's hypervisor to answer,
        until `PROVISION_TIMEOUT_SECONDS`; the image is ejected at the end either way. Only a
        cordoned or down node with no VM holding its GPUs, with BMC credentials, and no run in
        progress (409 otherwise, saying why)."""
        node = get_object_or_404(Node, pk=id)
        data = ProvisionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        run = provisioning.provisioning_start(
            node=node, image_url=data.validated_data["image_url"], actor=request.user
        )
        return Response(ProvisioningSerializer(run).data, status=status.HTTP_201_CREATED)
