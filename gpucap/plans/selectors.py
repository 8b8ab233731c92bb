"""Reads of plans for the capacity set page and the API, each a fixed number of queries."""

import hashlib
from dataclasses import dataclass

from django.db.models import Count, Prefetch, Q, QuerySet, Sum

from gpucap.fleet.models import CapacitySet, Gpu, Node, Pool
from gpucap.notices.models import InterruptionNotice
from gpucap.notices.selectors import DrainBlocker, _waiting_for
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.rentals.services import HOLDING

HISTORY_LENGTH = 20


def plans_list() -> QuerySet[Plan]:
    """Plans, newest first, with their set and approver (no per-row queries)."""
    return Plan.objects.select_related("capacity_set", "approved_by").order_by("-created_at", "-pk")


def plan_actions(plan: Plan) -> list[PlanAction]:
    """A plan's lines with everything the preview shows about each. One query."""
    return list(
        plan.actions.select_related(
            "vm", "for_vm", "tenant", "pool", "node", "vm__tenant", "for_vm__tenant"
        ).order_by("kind", "position")
    )


def plan_with_actions(*, plan_id: int) -> Plan:
    """One plan with its lines prefetched (``plan.actions.all()``). Two queries."""
    return (
        plans_list()
        .prefetch_related(
            Prefetch(
                "actions",
                queryset=PlanAction.objects.select_related(
                    "vm", "for_vm", "tenant", "pool", "node"
                ).order_by("kind", "position"),
            )
        )
        .get(pk=plan_id)
    )


def latest_plan(*, capacity_set: CapacitySet) -> Plan | None:
    return plans_list().filter(capacity_set=capacity_set).first()


def plan_history(*, capacity_set: CapacitySet, limit: int = HISTORY_LENGTH) -> list[Plan]:
    return list(plans_list().filter(capacity_set=capacity_set)[:limit])


@dataclass(frozen=True)
class PoolBar:
    """One pool of a set for the page's bars: GPUs held now, asked for by pending VMs, and held
    after the latest plan, against its floor."""

    pool: Pool
    held_gpus: int
    pending_gpus: int
    after_gpus: int
    scale_gpus: int  # the set's GPU total: every bar has the same scale

    def percent(self, gpus: int) -> float:
        return round(100 * gpus / self.scale_gpus, 2) if self.scale_gpus else 0.0

    @property
    def held_percent(self) -> float:
        return self.percent(self.held_gpus)

    @property
    def after_percent(self) -> float:
        return self.percent(self.after_gpus)

    @property
    def pending_percent(self) -> float:
        return self.percent(self.pending_gpus)

    @property
    def floor_percent(self) -> float:
        return self.percent(self.pool.floor_gpus)

    @property
    def change(self) -> int:
        return self.after_gpus - self.held_gpus


def pool_bars(
    *, capacity_set: CapacitySet, pools: list[Pool], plan: Plan | None, gpu_total: int
) -> list[PoolBar]:
    """Bars for ``pools`` (the set's, in rank order). Two queries: held and pending GPUs."""
    held = dict(
        Allocation.objects.filter(released_at=None, vm__pool__capacity_set=capacity_set)
        .values_list("vm__pool_id")
        .annotate(n=Count("pk"))
    )
    pending = dict(
        VirtualMachine.objects.filter(
            Q(state=VirtualMachine.State.PENDING), pool__capacity_set=capacity_set
        )
        .values_list("pool_id")
        .annotate(n=Sum("gpu_count"))
    )
    after = {entry["pool"]: entry["after_gpus"] for entry in (plan.pools if plan else [])}
    return [
        PoolBar(
            pool=pool,
            held_gpus=held.get(pool.pk, 0),
            pending_gpus=pending.get(pool.pk, 0),
            after_gpus=after.get(pool.pk, held.get(pool.pk, 0)),
            scale_gpus=gpu_total,
        )
        for pool in pools
    ]


# --- the capacity set page (appended for the plan pages) -----------------------------------------


@dataclass(frozen=True)
class PlanLines:
    """One plan with its lines split the way the preview shows them, and how far an applied
    plan got."""

    plan: Plan
    actions: list[PlanAction]

    @property
    def balances(self) -> list["PoolBalance"]:
        return pool_balance_rows(self.plan.pools)

    def _of(self, kind: str) -> list[PlanAction]:
        return [action for action in self.actions if action.kind == kind]

    @property
    def placements(self) -> list[PlanAction]:
        return self._of(PlanAction.Kind.PLACEMENT)

    @property
    def preemptions(self) -> list[PlanAction]:
        return self._of(PlanAction.Kind.PREEMPTION)

    @property
    def unsatisfied(self) -> list[PlanAction]:
        return self._of(PlanAction.Kind.UNSATISFIED)

    def _progress(self, kind: str, progress: str) -> int:
        return sum(1 for action in self._of(kind) if action.progress == progress)

    @property
    def notices_sent(self) -> int:
        return self._progress(PlanAction.Kind.PREEMPTION, PlanAction.Progress.DONE)

    @property
    def placements_done(self) -> int:
        return self._progress(PlanAction.Kind.PLACEMENT, PlanAction.Progress.DONE)

    @property
    def placements_waiting(self) -> int:
        return self._progress(PlanAction.Kind.PLACEMENT, PlanAction.Progress.WAITING)

    @property
    def placements_missed(self) -> int:
        return self._progress(PlanAction.Kind.PLACEMENT, PlanAction.Progress.MISSED)


def plan_lines(plan: Plan) -> PlanLines:
    """A plan with its lines. One query."""
    return PlanLines(plan=plan, actions=plan_actions(plan))


@dataclass(frozen=True)
class SetPlans:
    """What the capacity set page shows of the arbiter: the latest plan, the pools' bars against
    it, and the plan history (newest first)."""

    capacity_set: CapacitySet
    latest: PlanLines | None
    bars: list[PoolBar]
    history: list[Plan]

    @property
    def proposal(self) -> Plan | None:
        """The latest plan when it still waits to be applied."""
        if self.latest is not None and self.latest.plan.status == Plan.Status.PROPOSED:
            return self.latest.plan
        return None

    @property
    def key(self) -> str:
        """Changes whenever anything the live part of the page shows changes, so a poll that
        finds the same key has nothing new to show."""
        latest = self.latest
        parts = [self.capacity_set.generation, self.capacity_set.mode]
        if latest is not None:
            parts += [latest.plan.pk, latest.plan.status]
            parts += [action.progress for action in latest.actions]
        parts += [(bar.held_gpus, bar.pending_gpus, bar.after_gpus) for bar in self.bars]
        return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def capacity_set_plans(
    *, capacity_set: CapacitySet, pools: list[Pool] | None = None, gpu_total: int | None = None
) -> SetPlans:
    """The set's plans for its page: four queries (history, the latest plan's lines, held and
    pending GPUs), plus one each for ``pools`` and ``gpu_total`` when the caller has not read
    them already. The latest plan is the first of the history."""
    if pools is None:
        pools = list(capacity_set.pools.order_by("rank"))
    if gpu_total is None:
        gpu_total = Gpu.objects.filter(node__capacity_set=capacity_set).count()
    history = plan_history(capacity_set=capacity_set)
    latest = plan_lines(history[0]) if history else None
    # A refused plan's "after" never happens: the bars then show the pools as they are.
    shown = latest.plan if latest and latest.plan.status != Plan.Status.REFUSED else None
    return SetPlans(
        capacity_set=capacity_set,
        latest=latest,
        bars=pool_bars(capacity_set=capacity_set, pools=pools, plan=shown, gpu_total=gpu_total),
        history=history,
    )


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


@dataclass(frozen=True)
class PoolBalance:
    """One pool before and after a plan, against its floor (a row of the plan's ``pools``)."""

    name: str
    rank: int
    kind: str
    floor_gpus: int
    before_gpus: int
    after_gpus: int
    pending_gpus: int

    @property
    def change(self) -> int:
        return self.after_gpus - self.before_gpus

    @property
    def reclaimable_gpus(self) -> int:
        """GPUs above the floor after the plan: what a higher-ranked demand could still take."""
        return max(0, self.after_gpus - self.floor_gpus)

    @property
    def against_floor(self) -> str:
        """``none`` (no floor), ``below``, ``at`` or ``above``."""
        if not self.floor_gpus:
            return "none"
        if self.after_gpus < self.floor_gpus:
            return "below"
        return "at" if self.after_gpus == self.floor_gpus else "above"


def pool_balance_rows(pools: list[dict]) -> list[PoolBalance]:
    """A plan's (or a what-if's) ``pools`` entries as rows, in rank order. No query."""
    return sorted(
        (
            PoolBalance(
                name=entry["name"],
                rank=entry["rank"],
                kind=entry.get("kind", ""),
                floor_gpus=entry["floor_gpus"],
                before_gpus=entry["before_gpus"],
                after_gpus=entry["after_gpus"],
                pending_gpus=entry.get("pending_gpus", 0),
            )
            for entry in pools
        ),
        key=lambda row: row.rank,
    )
