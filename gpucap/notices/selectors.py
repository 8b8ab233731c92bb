"""Reads of notices and drains for pages and the API, each in a fixed number of queries.

Operators see every notice; a tenant member sees the notices of their own tenants' VMs, and
another tenant's notice id is a 404, as if it did not exist.
"""

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import OuterRef, Prefetch, QuerySet, Subquery
from django.http import Http404

from gpucap.fleet.models import Node, Pool
from gpucap.notices.models import InterruptionNotice
from gpucap.rentals.models import VirtualMachine
from gpucap.rentals.services import HOLDING
from gpucap.roles import is_operator, tenant_ids_for

State = VirtualMachine.State


def notices_with_vms() -> QuerySet[InterruptionNotice]:
    """Notices with what a row shows: the VM, its tenant, pool and node, who issued it, and the
    plan (and its set) that sent it."""
    return InterruptionNotice.objects.select_related(
        "vm__tenant", "vm__pool", "vm__node__cluster", "issued_by", "plan__capacity_set"
    )


def with_open_notice(vms: QuerySet[VirtualMachine]) -> QuerySet[VirtualMachine]:
    """The VMs, each with its open notice's reason and deadline (``notice_reason``,
    ``notice_deadline``, else None) for the countdown a row shows; in the same query."""
    open_notice = InterruptionNotice.objects.filter(vm=OuterRef("pk"), completed_at=None)
    return vms.annotate(
        notice_reason=Subquery(open_notice.values("reason")[:1]),
        notice_deadline=Subquery(open_notice.values("deadline")[:1]),
    )


def notices_visible_to(user: AbstractBaseUser) -> QuerySet[InterruptionNotice]:
    """Every notice for operators; the notices of the user's tenants' VMs for everyone else."""
    notices = notices_with_vms()
    if is_operator(user):
        return notices
    return notices.filter(vm__tenant_id__in=tenant_ids_for(user))


def notice_visible_to(*, user: AbstractBaseUser, pk: int) -> InterruptionNotice:
    notice = notices_visible_to(user).filter(pk=pk).first()
    if notice is None:
        raise Http404("No such notice.")
    return notice


@dataclass(frozen=True)
class DrainBlocker:
    """A VM that still holds GPUs of a draining node, and what the drain waits for."""

    vm: VirtualMachine
    waiting_for: str  # on_demand | notice | stopping | starting
    since: datetime  # holding the node's GPUs since
    notice: InterruptionNotice | None

    @property
    def explanation(self) -> str:
        return _EXPLANATIONS[self.waiting_for].format(
            deadline=self.notice.deadline.strftime("%H:%M:%S UTC") if self.notice else ""
        )


_EXPLANATIONS = {
    "on_demand": "on-demand: a drain never stops it; waiting for its owner to stop it",
    "notice": "notified: stops at its deadline, {deadline}, or earlier if the guest is done",
    "stopping": "stopping: the hypervisor is shutting it down",
    "starting": "still booting: it gets a notice once it runs",
}


def drain_blockers(node: Node) -> list[DrainBlocker]:
    """Who holds a node: every VM holding its GPUs, oldest first. Two queries."""
    return drain_blockers_by_node([node])[node.pk]


def drain_blockers_by_node(nodes: list[Node]) -> dict[int, list[DrainBlocker]]:
    """`gpucap.notices.selectors.drain_blockers` for many nodes at once: node id -> who holds
    it, oldest first. Two queries, whatever the number of nodes (none without nodes)."""
    blockers: dict[int, list[DrainBlocker]] = {node.pk: [] for node in nodes}
    if not nodes:
        return blockers
    open_notices = InterruptionNotice.objects.filter(completed_at=None)
    vms = (
        VirtualMachine.objects.filter(node_id__in=list(blockers), state__in=HOLDING)
        .select_related("tenant", "pool")
        .prefetch_related(Prefetch("notices", queryset=open_notices, to_attr="open_notices"))
        .order_by("started_at", "pk")
    )
    for vm in vms:
        blockers[vm.node_id].append(
            DrainBlocker(
                vm=vm,
                waiting_for=_waiting_for(vm),
                since=vm.started_at or vm.updated_at,
                notice=vm.open_notices[0] if vm.open_notices else None,
            )
        )
    return blockers


def _waiting_for(vm: VirtualMachine) -> str:
    if vm.state == State.STOPPING:
        return "stopping"
    if vm.state == State.NOTIFIED:
        return "notice"
    if vm.pool.kind == Pool.Kind.ON_DEMAND:
        return "on_demand"
    return "starting"
