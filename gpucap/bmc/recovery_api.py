"""REST API for recovery (docs/bmc.md, Recovery), for operators: a node's recovery and its power
cycles (``GET /api/nodes/<id>/recovery/``), the Power-cycle of a down node
(``POST /api/nodes/<id>/power-cycle/``), clearing a stopped recovery
(``POST /api/nodes/<id>/recovery/clear/``), and each cluster's policy
(``GET``/``PUT /api/clusters/<id>/recovery-policy/``). Every change goes through
``gpucap.bmc.recovery``; the power cycle itself runs in a worker, so a Power-cycle answers 202
at once with the recovery ``cycling`` — poll the recovery to follow it."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from gpucap.api.base import InputSerializer, OperatorCommand
from gpucap.bmc import recovery
from gpucap.bmc import recovery_selectors as selectors
from gpucap.bmc.recovery_models import (
    BOOT_TIMEOUT_SECONDS_MAX,
    GRACE_SECONDS_MAX,
    MAX_ATTEMPTS_MAX,
    NodeRecovery,
    RecoveryAttempt,
)
from gpucap.fleet.models import Cluster, Node


class RecoveryAttemptSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(
        source="actor.username",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The operator who asked for it; null for an automatic one.",
    )
    outcome = serializers.ChoiceField(
        choices=RecoveryAttempt.Outcome.choices,
        allow_blank=True,
        read_only=True,
        help_text="How it ended; empty while it runs.",
    )

    class Meta:
        model = RecoveryAttempt
        fields = [
            "id",
            "trigger",
            "actor",
            "started_at",
            "powered_on_at",
            "finished_at",
            "outcome",
            "message",
        ]
        read_only_fields = fields


class NodeRecoverySerializer(serializers.Serializer):
    node = serializers.IntegerField(source="node.pk")
    hostname = serializers.CharField(source="node.hostname")
    node_state = serializers.CharField(source="node.state")
    state = serializers.ChoiceField(
        choices=NodeRecovery.State.choices,
        help_text="idle, cycling (ForceOff, Off, On), waiting (for the hypervisor, until "
        "`deadline`) or stopped (automation leaves the node alone until an operator clears it).",
    )
    attempts = serializers.IntegerField(help_text="Power cycles failed in a row.")
    down_since = serializers.DateTimeField(allow_null=True)
    next_attempt_at = serializers.DateTimeField(
        allow_null=True, help_text="After a failed cycle: no automatic one before this."
    )
    deadline = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField(allow_blank=True)
    history = RecoveryAttemptSerializer(
        many=True, help_text="The node's latest power cycles, the newest first."
    )


class RecoveryPolicySerializer(serializers.Serializer):
    cluster = serializers.IntegerField(source="cluster.pk")
    cluster_name = serializers.CharField(source="cluster.name")
    auto_power_cycle = serializers.BooleanField()
    grace_seconds = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    boot_timeout_seconds = serializers.IntegerField()


class RecoveryPolicyUpdateSerializer(InputSerializer):
    """Fields left out keep their values."""

    auto_power_cycle = serializers.BooleanField(
        required=False,
        help_text="Power-cycle a down node through its BMC once it has been down grace_seconds.",
    )
    grace_seconds = serializers.IntegerField(
        required=False, min_value=0, max_value=GRACE_SECONDS_MAX
    )
    max_attempts = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_ATTEMPTS_MAX,
        help_text="Failed power cycles in a row after which recovery stops for the node.",
    )
    boot_timeout_seconds = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=BOOT_TIMEOUT_SECONDS_MAX,
        help_text="How long after power on the node's hypervisor has to answer.",
    )


class NodeRecoveryView(OperatorCommand):
    @extend_schema(responses=NodeRecoverySerializer, operation_id="nodes_recovery_retrieve")
    def get(self, request, id: int):
        """Where recovery stands for the node, and its latest power cycles."""
        node = get_object_or_404(Node, pk=id)
        return Response(NodeRecoverySerializer(selectors.recovery_panel(node)).data)


class NodePowerCycleView(OperatorCommand):
    @extend_schema(
        request=None,
        responses={202: NodeRecoverySerializer},
        operation_id="nodes_power_cycle_create",
    )
    def post(self, request, id: int):
        """Power-cycle a down node through its BMC (ForceOff, wait for Off, On), whatever its
        cluster's policy says (audited); the node is ready again once its hypervisor answers.
        202 with the recovery, `cycling`: a worker carries the cycle out; poll the recovery to
        follow it. A node that is not down, has no BMC address or credentials, or is being
        cycled already, is a 409 saying which."""
        node = get_object_or_404(Node, pk=id)
        recovery.power_cycle_request(node=node, actor=request.user)
        body = NodeRecoverySerializer(selectors.recovery_panel(node)).data
        return Response(body, status=status.HTTP_202_ACCEPTED)


class NodeRecoveryClearView(OperatorCommand):
    @extend_schema(
        request=None, responses=NodeRecoverySerializer, operation_id="nodes_recovery_clear_create"
    )
    def post(self, request, id: int):
        """Clear a stopped recovery: its failures are forgotten and automation may power-cycle
        the node again. A recovery that is not stopped is a 409."""
        node = get_object_or_404(Node, pk=id)
        recovery.recovery_clear(node=node, actor=request.user)
        return Response(NodeRecoverySerializer(selectors.recovery_panel(node)).data)


class ClusterRecoveryPolicyView(OperatorCommand):
    @extend_schema(
        responses=RecoveryPolicySerializer, operation_id="clusters_recovery_policy_retrieve"
    )
    def get(self, request, id: int):
        """The cluster's recovery policy (the defaults until one is set: no automatic power
        cycle, 600 s grace, 3 attempts, 900 s boot timeout)."""
        cluster = get_object_or_404(Cluster, pk=id)
        return Response(RecoveryPolicySerializer(recovery.policy_of(cluster)).data)

    @extend_schema(
        request=RecoveryPolicyUpdateSerializer,
        responses=RecoveryPolicySerializer,
        operation_id="clusters_recovery_policy_update",
    )
    def put(self, request, id: int):
        """Set the cluster's recovery policy; fields left out keep their values. A value out of
        range is a 400 naming the field, and nothing changes."""
        cluster = get_object_or_404(Cluster, pk=id)
        data = RecoveryPolicyUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        policy = recovery.recovery_policy_set(
            cluster=cluster, actor=request.user, **data.validated_data
        )
        return Response(RecoveryPolicySerializer(policy).data)
