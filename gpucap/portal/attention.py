"""What needs an operator's attention, for the strip on the page operators land on: plans
awaiting approval, notices due soonest, failed GPUs, nodes whose recovery stopped, nodes not
ready, pending requests by age and billing push failures. Each is a count and the few most
urgent entries, read in one query (the count is a window over the whole match, taken before the
LIMIT), so the strip costs seven queries whatever the fleet's size."""

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Case, Count, Q, QuerySet, Value, When, Window
from django.utils import timezone

from gpucap.bmc.recovery_selectors import recoveries_stopped
from gpucap.fleet.models import CapacitySet, Gpu, Node
from gpucap.notices.models import InterruptionNotice
from gpucap.plans.models import Plan
from gpucap.rentals.models import VirtualMachine
from gpucap.usage.models import BillingWebhook

# Each kind of item shows this many entries; the count says how many there are in all.
ATTENTION_ENTRIES = 5


@dataclass(frozen=True)
class AttentionItem:
    """One kind of thing that needs attention: how many, and the most urgent few (models, in
    the order the strip lists them)."""

    kind: str
    count: int
    entries: list = field(default_factory=list)

    @property
    def more(self) -> int:
        return self.count - len(self.entries)


@dataclass(frozen=True)
class Attention:
    now: datetime
    plans: AttentionItem
    notices: AttentionItem
    failed_gpus: AttentionItem
    recovery_stopped: AttentionItem
    nodes_not_ready: AttentionItem
    pending_vms: AttentionItem
    billing: AttentionItem

    @property
    def items(self) -> list[AttentionItem]:
        """The kinds with something in them, in the strip's order."""
        every = [
            self.plans,
            self.notices,
            self.failed_gpus,
            self.recovery_stopped,
            self.nodes_not_ready,
            self.pending_vms,
            self.billing,
        ]
        return [item for item in every if item.count]

    @property
    def empty(self) -> bool:
        return not self.items


def attention(*, now: datetime | None = None, entries: int = ATTENTION_ENTRIES) -> Attention:
    """Everything the strip shows. Seven queries, whatever the number of sets, nodes, GPUs,
    VMs or notices."""
    now = now or timezone.now()
    return Attention(
        now=now,
        plans=_item("plans", plans_awaiting_approval(), entries),
        notices=_item("notices", open_notices_due_soonest(), entries),
        failed_gpus=_item("failed_gpus", failed_gpus(), entries),
        # Power cycles failed (or a BMC refused) and automation gave up: an operator's turn.
        recovery_stopped=_item("recovery_stopped", recoveries_stopped(), entries),
        nodes_not_ready=_item("nodes_not_ready", nodes_not_ready(), entries),
        pending_vms=_item("pending_vms", pending_vms_oldest_first(), entries),
        billing=_billing_failures(),
    )


def plans_awaiting_approval() -> QuerySet[Plan]:
    """Proposed plans of dry-run sets that would do something (place or preempt), oldest
    first: an operator's Approve is all they wait for."""
    return (
        Plan.objects.filter(
            status=Plan.Status.PROPOSED,
            capacity_set__mode=CapacitySet.Mode.DRY_RUN,
        )
        .filter(Q(placements__gt=0) | Q(preemptions__gt=0))
        .select_related("capacity_set")
        .order_by("created_at", "id")
    )


def open_notices_due_soonest() -> QuerySet[InterruptionNotice]:
    """Notices not yet completed, the nearest deadline first."""
    return (
        InterruptionNotice.objects.filter(completed_at=None)
        .select_related("vm", "vm__tenant", "vm__pool")
        .order_by("deadline", "id")
    )


def failed_gpus() -> QuerySet[Gpu]:
    """Failed GPUs, by cluster, node and index."""
    return (
        Gpu.objects.filter(health=Gpu.Health.FAILED)
        .select_related("node", "node__cluster")
        .order_by("node__cluster__name", "node__hostname", "index")
    )


def nodes_not_ready() -> QuerySet[Node]:
    """Nodes down, draining or cordoned (the worst first), then by cluster and hostname."""
    worst_first = {Node.State.DOWN: 0, Node.State.DRAINING: 1, Node.State.CORDONED: 2}
    return (
        Node.objects.exclude(state=Node.State.READY)
        .select_related("cluster")
        .only("id", "hostname", "state", "gpu_count", "cluster__name")
        .annotate(
            severity=Case(
                *[When(state=state, then=Value(rank)) for state, rank in worst_first.items()],
                default=Value(3),
            )
        )
        .order_by("severity", "cluster__name", "hostname")
    )


def pending_vms_oldest_first() -> QuerySet[VirtualMachine]:
    """VMs waiting for capacity, the longest waiting first."""
    return (
        VirtualMachine.objects.filter(state=VirtualMachine.State.PENDING)
        .select_related("tenant", "pool")
        .order_by("requested_at", "id")
    )


def _item(kind: str, queryset: QuerySet, entries: int) -> AttentionItem:
    """The first ``entries`` rows and the count of all of them, in one query."""
    rows = list(queryset.annotate(attention_total=Window(Count("pk")))[:entries])
    return AttentionItem(kind=kind, count=rows[0].attention_total if rows else 0, entries=rows)


def _billing_failures() -> AttentionItem:
    """The billing webhook when it is on and its last pushes failed; the count is how many
    failed in a row."""
    webhook = BillingWebhook.objects.filter(enabled=True, consecutive_failures__gt=0).first()
    if webhook is None:
        return AttentionItem(kind="billing", count=0)
    return AttentionItem(kind="billing", count=webhook.consecutive_failures, entries=[webhook])
