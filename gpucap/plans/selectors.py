"""Reads of plans for the capacity set page and the API, each a fixed number of queries."""

from dataclasses import dataclass, field

from django.db.models import Count, Prefetch, Q, QuerySet, Sum

from gpucap.fleet.models import CapacitySet, Gpu, Pool
from gpucap.notices.models import InterruptionNotice
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals.models import Allocation, VirtualMachine

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
        return self.percent(self.pool.floor_in_force)

    @property
    def change(self) -> int:
        return self.after_gpus - self.held_gpus

    @property
    def protects(self) -> str:
        """The pool's protection window in words ("10 min"), or "" when it protects nothing."""
        return duration_words(self.pool.protect_seconds)


def duration_words(seconds: int) -> str:
    """A whole number of seconds as a person says it: "45 s", "10 min", "1 h 30 min", "2 d"."""
    if not seconds:
        return ""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {unit}")
    return " ".join(parts)


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

# The set page lists this many lines of each kind of the latest plan (a plan for a 2,000-node set
# can have hundreds); the plan's own page lists them all.
PREVIEW_LINES = 25


@dataclass(frozen=True)
class PlanLines:
    """One plan with its lines split the way the preview shows them (maybe only the first
    ``limit`` of each kind), and how far an applied plan got."""

    plan: Plan
    actions: list[PlanAction]
    progress: dict[tuple[str, str], int]  # (kind, progress) -> lines, over all the plan's lines
    limit: int | None = None
    # An applied plan: its notices by victim VM id (each preemption line's countdown or outcome)
    # and how many of its placed VMs are still booting.
    notices: dict[int, InterruptionNotice] = field(default_factory=dict)
    booting: int = 0

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

    @property
    def placements_not_shown(self) -> int:
        return self.plan.placements - len(self.placements)

    @property
    def preemptions_not_shown(self) -> int:
        return self.plan.preemptions - len(self.preemptions)

    @property
    def unsatisfied_not_shown(self) -> int:
        return self.plan.unsatisfied - len(self.unsatisfied)

    @property
    def notices_sent(self) -> int:
        return self.progress.get((PlanAction.Kind.PREEMPTION, PlanAction.Progress.DONE), 0)

    @property
    def placements_done(self) -> int:
        return self.progress.get((PlanAction.Kind.PLACEMENT, PlanAction.Progress.DONE), 0)

    @property
    def placements_waiting(self) -> int:
        return self.progress.get((PlanAction.Kind.PLACEMENT, PlanAction.Progress.WAITING), 0)

    @property
    def placements_missed(self) -> int:
        return self.progress.get((PlanAction.Kind.PLACEMENT, PlanAction.Progress.MISSED), 0)

    @property
    def notices_open(self) -> int:
        return sum(1 for notice in self.notices.values() if notice.completed_at is None)

    @property
    def in_flight(self) -> bool:
        """An applied plan not done yet: a notice still counting down, a placement waiting for
        its victims, or a placed VM still booting."""
        return bool(self.notices_open or self.placements_waiting or self.booting)


# A placement line whose VM is still booting.
BOOTING = Q(kind=PlanAction.Kind.PLACEMENT, vm__state=VirtualMachine.State.PROVISIONING)


def plan_lines(plan: Plan, *, limit: int | None = None) -> PlanLines:
    """A plan with its lines (the first ``limit`` of each kind, or all) and its progress counts:
    two queries, and one more for an applied plan's notices."""
    actions = plan.actions.all()
    if limit is not None:
        # Positions count from 0 within each kind: one query takes the head of every kind.
        actions = actions.filter(position__lt=limit)
    progress = (
        plan.actions.exclude(progress="")
        .order_by()
        .values_list("kind", "progress")
        .annotate(n=Count("pk"), booting=Count("pk", filter=BOOTING))
    )
    counts = {(kind, state): (n, booting) for kind, state, n, booting in progress}
    notices = {}
    if plan.status == Plan.Status.APPLIED and plan.preemptions:
        # Each victim's notice from this plan (a VM has one at a time; the newest wins).
        for notice in InterruptionNotice.objects.filter(plan=plan).order_by("issued_at", "pk"):
            notices[notice.vm_id] = notice
    lines = list(
        actions.select_related(
            "vm", "for_vm", "tenant", "pool", "node", "vm__tenant", "for_vm__tenant"
        ).order_by("kind", "position")
    )
    for line in lines:
        # A preemption line's notice (its countdown or how it ended), for the progress column.
        line.notice = notices.get(line.vm_id) if line.kind == PlanAction.Kind.PREEMPTION else None
    return PlanLines(
        plan=plan,
        actions=lines,
        progress={key: n for key, (n, _) in counts.items()},
        limit=limit,
        notices=notices,
        booting=counts.get((PlanAction.Kind.PLACEMENT, PlanAction.Progress.DONE), (0, 0))[1],
    )


@dataclass(frozen=True)
class SetPlans:
    """What the capacity set page shows of the arbiter: the latest plan, the pools' bars against
    it, and the plan history (newest first)."""

    capacity_set: CapacitySet
    latest: PlanLines | None
    bars: list[PoolBar]
    history: list[Plan]
    # The newest applied plan that acts, while it is still in flight and no longer the latest:
    # pinned above the latest plan so its countdowns and placements can be watched to the end.
    pinned: PlanLines | None = None

    @property
    def folded(self) -> int:
        """Identical replans folded into the plans of the history."""
        return sum(plan.replans for plan in self.history)

    @property
    def proposal(self) -> Plan | None:
        """The latest plan when it still waits to be applied."""
        if self.latest is not None and self.latest.plan.status == Plan.Status.PROPOSED:
            return self.latest.plan
        return None


def capacity_set_plans(
    *, capacity_set: CapacitySet, pools: list[Pool] | None = None, gpu_total: int | None = None
) -> SetPlans:
    """The set's plans for its page: five queries (history; the latest plan's first lines and
    its progress; held and pending GPUs), plus one each for ``pools`` and ``gpu_total`` when the
    caller has not read them already, one for an applied latest plan's notices and three for a
    pinned plan. The latest plan is the first of the history."""
    if pools is None:
        pools = list(capacity_set.pools.order_by("rank"))
    if gpu_total is None:
        gpu_total = Gpu.objects.filter(node__capacity_set=capacity_set).count()
    history = plan_history(capacity_set=capacity_set)
    latest = plan_lines(history[0], limit=PREVIEW_LINES) if history else None
    # A refused plan's "after" never happens: the bars then show the pools as they are.
    shown = latest.plan if latest and latest.plan.status != Plan.Status.REFUSED else None
    return SetPlans(
        capacity_set=capacity_set,
        latest=latest,
        bars=pool_bars(capacity_set=capacity_set, pools=pools, plan=shown, gpu_total=gpu_total),
        history=history,
        pinned=_pinned(history),
    )


def _pinned(history: list[Plan]) -> PlanLines | None:
    applied = next((p for p in history if p.status == Plan.Status.APPLIED and p.has_actions), None)
    if applied is None or applied is history[0]:
        return None
    lines = plan_lines(applied, limit=PREVIEW_LINES)
    return lines if lines.in_flight else None


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
