"""Reads of recovery shared by the node page, the API and the operators' attention strip, each
in a fixed number of queries."""

from dataclasses import dataclass
from datetime import datetime

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import QuerySet

from gpucap.bmc.recovery_models import NodeRecovery, RecoveryAttempt, RecoveryPolicy
from gpucap.fleet.models import Node

# How many of a node's power cycles its page and the API show, the newest first.
HISTORY = 10


@dataclass(frozen=True)
class RecoveryPanel:
    """Where recovery stands for one node, what may be done about it, and its history."""

    node: Node
    recovery: NodeRecovery  # unsaved and idle for a node never down since recovery knew it
    policy: RecoveryPolicy  # unsaved: the defaults
    history: list[RecoveryAttempt]
    has_bmc: bool

    @property
    def state(self) -> str:
        return self.recovery.state

    @property
    def attempts(self) -> int:
        return self.recovery.attempts

    @property
    def down_since(self) -> datetime | None:
        return self.recovery.down_since

    @property
    def next_attempt_at(self) -> datetime | None:
        return self.recovery.next_attempt_at

    @property
    def deadline(self) -> datetime | None:
        return self.recovery.deadline

    @property
    def last_error(self) -> str:
        return self.recovery.last_error

    @property
    def busy(self) -> bool:
        """A cycle runs: the page polls until it ends."""
        return self.recovery.state in (NodeRecovery.State.CYCLING, NodeRecovery.State.WAITING)

    @property
    def can_power_cycle(self) -> bool:
        return (
            self.node.state == Node.State.DOWN
            and self.has_bmc
            and self.recovery.state in (NodeRecovery.State.IDLE, NodeRecovery.State.STOPPED)
        )

    @property
    def can_clear(self) -> bool:
        return self.recovery.state == NodeRecovery.State.STOPPED


def recovery_panel(node: Node) -> RecoveryPanel:
    """The node's recovery, its cluster's policy and its latest power cycles: two queries."""
    row = (
        Node.objects.select_related("recovery", "cluster__recovery_policy", "bmc_credential")
        .only(
            "state",
            "bmc_address",
            "cluster_id",
            "recovery",
            "cluster__recovery_policy",
            "bmc_credential__id",
            "bmc_credential__node_id",
        )
        .get(pk=node.pk)
    )
    history = list(
        RecoveryAttempt.objects.filter(node=node)
        .select_related("actor")
        .order_by("-started_at", "-id")[:HISTORY]
    )
    return RecoveryPanel(
        node=node,
        recovery=_related(row, "recovery") or NodeRecovery(node=node),
        policy=_related(row.cluster, "recovery_policy") or RecoveryPolicy(cluster=node.cluster),
        history=history,
        has_bmc=bool(row.bmc_address) and _related(row, "bmc_credential") is not None,
    )


def _related(obj, name: str):
    """A reverse one-to-one loaded by ``select_related``, or None where there is no row."""
    try:
        return getattr(obj, name)
    except ObjectDoesNotExist:
        return None


def recoveries_stopped() -> QuerySet[NodeRecovery]:
    """Nodes whose recovery stopped (a BMC that refused, or max_attempts failed cycles), for
    the attention strip: the longest stopped first."""
    return (
        NodeRecovery.objects.filter(state=NodeRecovery.State.STOPPED)
        .select_related("node__cluster")
        .order_by("updated_at", "node_id")
    )
