"""The arbiter on the live fleet (DESIGN.md section 8): plan each capacity set, store the plan,
and apply it when an operator approves it or the set enforces.

Everything that plans or applies for one set runs under the set's transaction-level advisory
lock (`gpucap.locks.CAPACITY_SET`), so two workers never plan or apply for one set at once. An
apply also re-reads the set's generation under a row lock, after locking the plan's VMs: any
change to the set's plan inputs bumps the generation in the changing transaction, so a plan is
applied only to exactly the state it was made from. A plan goes from ``proposed`` to ``applied``
by a conditional update, and every step of an apply is idempotent on its own (one open notice
per VM, one live holder per GPU), so a retried or duplicated apply sends no second notice and
places nothing twice.

How an applied plan acts:

- each preemption of a running VM -> an ``arbiter`` notice with the set's ``notice_seconds``,
  pointing at the VM whose placement takes its GPUs (``preempted_for``); a victim still booting
  has no guest to warn and is stopped at once;
- each placement on GPUs that are free now -> ``vm_place`` at once;
- each placement that needs a victim's GPUs -> ``waiting``: it is placed as soon as its victims
  are off (`placements_complete`, run by every tick), in dry-run too, because it was approved,
  or marked missed when its VM or GPUs changed meanwhile. Until then its GPUs stay reserved in
  every later snapshot and its VM is no demand of any later plan, so the plan that notified
  the victims is the one plan that records the placement.

Before any of that, the victims of the set's proposed plan are "at risk" (gpucap.plans.at_risk):
every change of which plan is proposed (made, superseded, applied, refused) has
``at_risk_follow`` bring their flags along in the same transaction.
"""

import hashlib
import logging
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Min, Q
from django.utils import timezone

from gpucap import arbiter, locks, metrics
from gpucap.arbiter import model as am
from gpucap.arbiter.topology import block_sizes
from gpucap.audit.services import Actor, audit_record
from gpucap.errors import Conflict
from gpucap.fleet.models import CapacitySet, Gpu, Pool
from gpucap.gcpause import collector_paused
from gpucap.killpoints import kill_point, kill_point_on_commit
from gpucap.notices import services as notices
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import snapshot_cache
from gpucap.plans.at_risk import at_risk_follow
from gpucap.plans.models import Plan, PlanAction
from gpucap.plans.reservation_feed import (
    borrowed_flags_write,
    placement_flags_copy,
    placement_reservation_ids,
    plan_reports,
)
from gpucap.plans.snapshot import IN_FLIGHT, SetSnapshot, capacity_set_snapshot, with_policy
from gpucap.plans.triggers import replan_soon
from gpucap.rentals import services as rentals
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.schedules.selectors import set_schedule
from gpucap.tasks import wake_at

logger = logging.getLogger(__name__)

Status = Plan.Status
Kind = PlanAction.Kind
Progress = PlanAction.Progress
Mode = CapacitySet.Mode
State = VirtualMachine.State


class StalePlan(Conflict):
    """The set changed since the plan was made: it is not applied. ``fresh`` is the plan of the
    set as it is now, for the operator to review instead."""

    def __init__(self, plan: Plan, *, generation: int, fresh: Plan | None = None) -> None:
        fresh_words = f"; review plan {fresh.pk} instead" if fresh is not None else ""
        super().__init__(
            f"plan {plan.pk} was made from generation {plan.generation} of capacity set "
            f"{plan.capacity_set.name}, which is at generation {generation} now{fresh_words}",
            code="stale_plan",
        )
        self.plan = plan
        self.fresh = fresh


# --- one tick for one set ------------------------------------------------------------------------


@dataclass
class Tick:
    capacity_set_id: int
    plan: Plan | None = None
    applied: bool = False
    placed_waiting: list[int] = field(default_factory=list)


def capacity_set_tick(*, capacity_set_id: int, trigger: str = Plan.Trigger.PERIODIC) -> Tick:
    """Bring one set up to date: place approved placements whose victims are off, plan the set
    if it changed since its latest plan, and apply the plan if the set enforces. Harmless to
    run at any time and any number of times.

    Two transactions, each under the set's advisory lock: the placements commit before the
    plan is made, so the apply never holds the set's row while it waits for a VM's row (which
    a VM's own transition holds while it waits for the set's row to bump its generation). A
    victim going off between the two leaves a placement waiting while the plan is made; the
    snapshot keeps that placement's VM and block out of the plan, and the next tick completes
    it."""
    tick = Tick(capacity_set_id=capacity_set_id)
    with transaction.atomic():
        locks.xact_lock(locks.CAPACITY_SET, capacity_set_id)
        capacity_set = CapacitySet.objects.filter(pk=capacity_set_id).first()
        if capacity_set is None:
            return tick  # deleted since the tick was sent
        tick.placed_waiting = placements_complete(capacity_set=capacity_set)
    with transaction.atomic():
        locks.xact_lock(locks.CAPACITY_SET, capacity_set_id)
        capacity_set = CapacitySet.objects.filter(pk=capacity_set_id).first()
        if capacity_set is None:
            return tick
        tick.plan = _plan_locked(capacity_set, trigger=trigger)
        if capacity_set.mode == Mode.ENFORCE and tick.plan.status == Status.PROPOSED:
            tick.applied = _apply_or_refuse(tick.plan, actor=None)
    return tick


def plan_make(*, capacity_set: CapacitySet, trigger: str = Plan.Trigger.OPERATOR) -> Plan:
    """The set's plan for its current generation (made now if there is none). Never applies."""
    with transaction.atomic():
        locks.xact_lock(locks.CAPACITY_SET, capacity_set.pk)
        capacity_set = CapacitySet.objects.get(pk=capacity_set.pk)
        return _plan_locked(capacity_set, trigger=trigger)


def _plan_locked(capacity_set: CapacitySet, *, trigger: str) -> Plan:
    """The set's plan for its current generation. A plan that places nothing and reclaims
    nothing, found again exactly as the latest one, folds into it (its ``replans`` count) and
    is neither stored as a new row nor applied nor audited."""
    latest = latest_plan(capacity_set=capacity_set)
    if (
        latest is not None
        and latest.generation == _generation(capacity_set.pk)
        and not _protection_ended(latest)
    ):
        return latest  # nothing a plan depends on changed since
    with collector_paused():  # see gpucap/gcpause.py: it would cost as much as the reading
        snap = consistent_snapshot(capacity_set)
        started = timezone.now()
        result = arbiter.plan(snap.snapshot)
        elapsed_ms = int((timezone.now() - started).total_seconds() * 1000)
    acts = bool(result.placements or result.preemptions)
    reports = plan_reports(result)
    borrowed_flags_write(capacity_set, reports)
    if (
        not acts
        and latest
        and latest.status == Status.NOTHING
        and _leaves_same(latest, snap, result)
    ):
        return _fold(latest, snap, result, reports)
    Plan.objects.filter(capacity_set=capacity_set, status=Status.PROPOSED).update(
        status=Status.SUPERSEDED
    )
    plan = Plan.objects.create(
        capacity_set=capacity_set,
        generation=snap.generation,
        mode=capacity_set.mode,
        status=Status.PROPOSED if acts else Status.NOTHING,
        trigger=trigger,
        complete=result.complete,
        demands=len(snap.snapshot.demands),
        placements=len(result.placements),
        preemptions=len(result.preemptions),
        preempted_gpus=sum(len(p.gpus) for p in result.preemptions),
        unsatisfied=len(result.unsatisfied),
        pools=pool_balances(snap, result),
        reservations=reports,
        digest=hashlib.sha256(arbiter.dump_plan(result).encode()).hexdigest(),
        planning_ms=elapsed_ms,
    )
    with collector_paused():
        PlanAction.objects.bulk_create(plan_actions(plan, snap, result))
    _wake_when_protection_ends(capacity_set, result)
    at_risk_follow(capacity_set=capacity_set)
    metrics.shared_count_on_commit(metrics.PLANS_MADE, set=capacity_set.name, mode=plan.mode)
    logger.info(
        "capacity set %s generation %s: plan %s, %s placements, %s preemptions, %s unsatisfied",
        capacity_set.name,
        plan.generation,
        plan.pk,
        plan.placements,
        plan.preemptions,
        plan.unsatisfied,
    )
    return plan


def _protection_ended(plan: Plan) -> bool:
    """Whether a demand of ``plan`` (from `latest_plan`) waited for protection that has ended
    since: time, not the generation, changed what the set's plan would be."""
    return plan.first_wait_end is not None and plan.first_wait_end <= timezone.now()


def _wake_when_protection_ends(capacity_set: CapacitySet, result: am.Plan) -> None:
    """Plan the set again the moment the first protection a demand waits for ends."""
    waits = [entry.waits_until for entry in result.unsatisfied if entry.waits_until is not None]
    if waits:
        wake_at("plans.replan", capacity_set.pk, min(waits))


def _leaves_same(latest: Plan, snap: SetSnapshot, result: am.Plan) -> bool:
    """Whether ``result``, which does nothing, leaves the same demands unsatisfied for the same
    reasons as ``latest`` (the pools' numbers may differ: a plan that does nothing changes none)."""
    vms = snap.vms
    unsatisfied = {(vms[u.demand].pk, u.reason) for u in result.unsatisfied}
    before = set(latest.actions.filter(kind=Kind.UNSATISFIED).values_list("vm_id", "reason"))
    return latest.complete == result.complete and before == unsatisfied


def _fold(latest: Plan, snap: SetSnapshot, result: am.Plan, reports: list[dict]) -> Plan:
    """The replan found ``latest`` again: it now stands for the set's current generation (with
    the pools' current numbers); one more replan is counted on it."""
    now = timezone.now()
    Plan.objects.filter(pk=latest.pk).update(
        generation=snap.generation,
        pools=pool_balances(snap, result),
        reservations=reports,
        demands=len(snap.snapshot.demands),
        replans=F("replans") + 1,
        replanned_at=now,
    )
    latest.refresh_from_db()
    metrics.shared_count_on_commit(metrics.PLANS_FOLDED, set=latest.capacity_set.name)
    logger.debug(
        "capacity set %s generation %s: nothing to do, as in plan %s (%s replans folded)",
        latest.capacity_set.name,
        latest.generation,
        latest.pk,
        latest.replans,
    )
    return latest


def consistent_snapshot(
    capacity_set: CapacitySet, *, extra_demands: Iterable[am.Demand] = ()
) -> SetSnapshot:
    """The set's snapshot, read again when the set changed while it was read. Its queries each
    see the latest commits (READ COMMITTED), so a VM that stopped between two of them could be
    both a holder and a demand; every such change bumps the generation, so an unchanged
    generation after the reads means they saw one state."""
    for _ in range(_SNAPSHOT_ATTEMPTS):
        snap = capacity_set_snapshot(capacity_set, extra_demands=extra_demands)
        if _generation(capacity_set.pk) == snap.generation:
            break
    problems = arbiter.snapshot_problems(snap.snapshot)
    if problems:
        # Read at one generation, the services keep the set consistent: this is a bug.
        raise RuntimeError(
            f"capacity set {capacity_set.name}: the snapshot is not valid: {'; '.join(problems)}"
        )
    return snap


_SNAPSHOT_ATTEMPTS = 5


def latest_plan(*, capacity_set: CapacitySet) -> Plan | None:
    """The set's latest plan, with ``first_wait_end``: the earliest moment a demand it left
    waiting for protection may go ahead (see `_protection_ended`), in the same query."""
    return (
        Plan.objects.filter(capacity_set=capacity_set)
        .annotate(
            first_wait_end=Min("actions__waits_until", filter=Q(actions__kind=Kind.UNSATISFIED))
        )
        .order_by("-created_at", "-pk")
        .first()
    )


def pool_balances(snap: SetSnapshot, result: am.Plan) -> list[dict]:
    """Each pool of the set before and after the plan, with the GPUs its pending VMs ask for."""
    pending = Counter()
    for demand in snap.snapshot.demands:
        pending[demand.pool] += demand.gpus
    by_name = {pool.name: pool for pool in snap.live.pools.values()}
    return [
        {
            "pool": by_name[balance.name].pk,
            "name": balance.name,
            "rank": balance.rank,
            "kind": by_name[balance.name].kind,
            "floor_gpus": balance.floor_gpus,
            "before_gpus": balance.before_gpus,
            "after_gpus": balance.after_gpus,
            "pending_gpus": pending[balance.name],
        }
        for balance in result.pools
        if balance.name in by_name  # not the "(other pools)" stand-in
    ]


def plan_actions(plan: Plan | None, snap: SetSnapshot, result: am.Plan) -> list[PlanAction]:
    """The plan's lines as (unsaved) actions naming the VMs, tenants, pools and nodes. Demands
    that are no VM (a what-if's) have no ``vm``; ``subject`` names them either way."""
    vms, nodes = snap.vms, snap.nodes
    pools = {pool.name: pool for pool in snap.live.pools.values()}
    demands = {demand.id: demand for demand in snap.snapshot.demands}
    actions: list[PlanAction] = []

    def action(kind: str, position: int, subject: str, **fields) -> PlanAction:
        vm = vms.get(subject)
        line = PlanAction(
            plan=plan,
            kind=kind,
            position=position,
            vm=vm,
            tenant=vm.tenant if vm is not None else None,
            pool=pools.get(demands[subject].pool if subject in demands else vm.pool.name),
            **fields,
        )
        line.subject = subject
        return line

    for position, placement in enumerate(result.placements):
        reservation_id, borrowed_from_id = placement_reservation_ids(placement)
        actions.append(
            action(
                Kind.PLACEMENT,
                position,
                placement.demand,
                node=nodes[placement.node],
                gpus=list(placement.gpus),
                group=demands[placement.demand].group,
                reason=placement_words(placement.preempts),
                reservation_id=reservation_id,
                borrowed_from_id=borrowed_from_id,
            )
        )
    for position, preemption in enumerate(result.preemptions):
        line = action(
            Kind.PREEMPTION,
            position,
            preemption.vm,
            for_vm=vms.get(preemption.for_demand),
            node=nodes[preemption.node],
            gpus=list(preemption.gpus),
            group=demands[preemption.for_demand].group,
            running_since=vms[preemption.vm].started_at,
            reason=preemption.reason,
        )
        line.for_subject = preemption.for_demand
        actions.append(line)
    for position, unsatisfied in enumerate(result.unsatisfied):
        actions.append(
            action(
                Kind.UNSATISFIED,
                position,
                unsatisfied.demand,
                group=unsatisfied.group,
                reason=unsatisfied.reason,
                waits_until=unsatisfied.waits_until,
            )
        )
    return actions


def placement_words(preempts: Sequence[str]) -> str:
    """How a placement gets its GPUs, as a plan's line says it (also for simulated plans)."""
    if not preempts:
        return "free GPUs"
    return f"GPUs freed by {', '.join(preempts)}"


# --- applying a plan -----------------------------------------------------------------------------


def plan_approve(*, plan: Plan, actor: Actor) -> Plan:
    """An operator applies exactly this plan, once. Refused (``StalePlan``, 409) when the set
    changed since the plan was made; the fresh plan is then made, kept, and named in the error.
    """
    with transaction.atomic():
        locks.xact_lock(locks.CAPACITY_SET, plan.capacity_set_id)
        plan = Plan.objects.select_related("capacity_set").get(pk=plan.pk)
        if plan.status == Status.NOTHING:
            raise Conflict(
                f"plan {plan.pk} has nothing to apply: it places no demand and notifies no VM",
                code="plan_nothing_to_apply",
            )
        if plan.status == Status.APPLIED:
            raise Conflict(
                f"plan {plan.pk} was applied at {plan.applied_at:%Y-%m-%d %H:%M:%S} UTC"
                + (f" (approved by {plan.approved_by})" if plan.approved_by_id else ""),
                code="plan_already_applied",
            )
        if plan.status == Status.PROPOSED and plan.generation == _generation(plan.capacity_set_id):
            try:
                with transaction.atomic():
                    _apply(plan, actor=actor)
            except StalePlan:
                pass  # a VM changed between the two reads: refuse it as below
            else:
                audit_record(
                    actor=actor,
                    verb="plan.approve",
                    target=plan.capacity_set,
                    after={"plan": plan.pk, "generation": plan.generation},
                    message=_summary(plan),
                )
                return plan
        # Stale: keep the fresh plan (this transaction commits), then refuse.
        fresh = _plan_locked(
            CapacitySet.objects.get(pk=plan.capacity_set_id), trigger=Plan.Trigger.APPROVAL
        )
        audit_record(
            actor=actor,
            verb="plan.approve_refused",
            target=plan.capacity_set,
            before={"plan": plan.pk, "generation": plan.generation},
            after={"plan": fresh.pk, "generation": fresh.generation},
            message=f"plan {plan.pk} is stale; fresh plan {fresh.pk}",
        )
    raise StalePlan(plan, generation=fresh.generation, fresh=fresh)


def _apply_or_refuse(plan: Plan, *, actor: Actor) -> bool:
    """Apply under enforcement. A plan the set outran is marked refused (the set's next tick
    plans again); returns whether it was applied."""
    try:
        with transaction.atomic():
            _apply(plan, actor=actor)
    except Conflict as exc:
        Plan.objects.filter(pk=plan.pk, status=Status.PROPOSED).update(
            status=Status.REFUSED, status_message=exc.message
        )
        plan.refresh_from_db()
        at_risk_follow(capacity_set=plan.capacity_set)
        logger.info("plan %s not applied: %s", plan.pk, exc.message)
        replan_soon(plan.capacity_set_id)
        return False
    audit_record(
        actor=None,
        verb="plan.enforce",
        target=plan.capacity_set,
        after={"plan": plan.pk, "generation": plan.generation},
        message=_summary(plan),
    )
    return True


def _generation(capacity_set_id: int) -> int:
    return CapacitySet.objects.filter(pk=capacity_set_id).values_list("generation", flat=True)[0]


def _apply(plan: Plan, *, actor: Actor) -> None:
    """Act on a proposed plan; the caller holds the set's advisory lock. Raises Conflict (and
    the caller's transaction rolls back) when anything differs from what the plan saw.

    One transaction: the plan's status, its notices, its placements and the progress of each
    line commit together or not at all, so a worker dying anywhere in here leaves either the
    whole apply or none of it (the ``kill_point``s are where the tests kill it)."""
    kill_point("plans.apply:start")
    actions = list(
        plan.actions.exclude(kind=Kind.UNSATISFIED)
        .select_related("vm__pool", "for_vm__pool", "node")
        .order_by("kind", "position")
    )
    # VM rows before the set's row: a VM transition locks its VM, then bumps the set's
    # generation (its row), so this order cannot deadlock with one.
    vm_ids = {a.vm_id for a in actions} | {a.for_vm_id for a in actions if a.for_vm_id}
    list(VirtualMachine.objects.select_for_update(no_key=True).filter(pk__in=vm_ids).order_by("pk"))
    capacity_set = CapacitySet.objects.select_for_update(no_key=True).get(pk=plan.capacity_set_id)
    if capacity_set.generation != plan.generation:
        raise StalePlan(plan, generation=capacity_set.generation)
    now = timezone.now()
    applied = Plan.objects.filter(pk=plan.pk, status=Status.PROPOSED).update(
        status=Status.APPLIED,
        applied_at=now,
        approved_by=actor if actor is not None and actor.is_authenticated else None,
        approved_at=now if actor is not None else None,
    )
    if applied != 1:
        raise Conflict(f"plan {plan.pk} is no longer proposed", code="plan_not_proposed")
    plan.refresh_from_db()
    at_risk_follow(capacity_set=capacity_set)  # its victims' notices take over
    # Registered before the notices and placements register their tasks, so the test that dies
    # here dies before any of them is sent.
    kill_point_on_commit("plans.apply:committed")
    # Counted on commit: an apply that a later step rolls back was never applied.
    metrics.shared_count_on_commit(metrics.PLANS_APPLIED, set=capacity_set.name, mode=plan.mode)

    leaving: dict[int, set[int]] = defaultdict(set)  # node id -> GPUs victims still hold
    for action in actions:
        if action.kind == Kind.PREEMPTION:
            _preempt(plan, action, seconds=capacity_set.notice_seconds)
            leaving[action.node_id].update(action.gpus)
    kill_point("plans.apply:notices-sent")
    for action in actions:
        if action.kind != Kind.PLACEMENT:
            continue
        if leaving[action.node_id] & set(action.gpus):
            _progress(action, Progress.WAITING, "waits for its victims to stop")
            continue
        placed_at = timezone.now()
        rentals.vm_place(
            vm=action.vm,
            node=action.node,
            gpu_indices=action.gpus,
            actor=actor,
            message=f"plan {plan.pk}: {action.reason}",
        )
        placement_flags_copy(action.vm, action, placed_at=placed_at)
        _progress(action, Progress.DONE)
    kill_point("plans.apply:placements-recorded")


def _preempt(plan: Plan, action: PlanAction, *, seconds: int) -> None:
    victim = VirtualMachine.objects.get(pk=action.vm_id)
    message = f"plan {plan.pk}: {action.reason}"
    if victim.state == State.PROVISIONING:
        # Still booting: there is no guest to read a notice yet, and no work to lose.
        rentals.vm_preempt(vm=victim, for_vm=action.for_vm, message=message)
        _progress(action, Progress.DONE, "stopped while booting, without notice")
        return
    notices.notice_issue(
        vm=victim,
        reason=InterruptionNotice.Reason.ARBITER,
        message=message,
        preempted_for=action.for_vm,
        seconds=seconds,
        plan=plan,
    )
    _progress(action, Progress.DONE)


def _progress(action: PlanAction, progress: str, message: str = "") -> None:
    action.progress, action.progress_message = progress, message
    action.save(update_fields=["progress", "progress_message"])


def _summary(plan: Plan) -> str:
    return (
        f"plan {plan.pk}: {plan.placements} placement(s), {plan.preemptions} notice(s) "
        f"({plan.preempted_gpus} GPUs), {plan.unsatisfied} unsatisfied"
    )


def placements_complete(*, capacity_set: CapacitySet) -> list[int]:
    """Place each waiting placement of an applied plan whose victims are all off, on the GPUs the
    plan gave it. A placement whose VM or GPUs changed meanwhile is marked missed (its VM, if
    still pending, is planned again). Returns the VMs placed."""
    placed = []
    waiting = list(
        PlanAction.objects.filter(
            plan__capacity_set=capacity_set, kind=Kind.PLACEMENT, progress=Progress.WAITING
        )
        .select_related("plan", "node")
        .order_by("plan_id", "position")
    )
    # Most placements wait for victims whose notices run for minutes: find those in two
    # queries rather than locking and asking for each on every tick. A victim that goes off
    # after this read bumps the set's generation once it commits, and the tick that asks for
    # places the VM.
    waiting_vms = [action.vm_id for action in waiting]
    leaving_for = set(
        VirtualMachine.objects.filter(
            preempted_for_id__in=waiting_vms, state__in=IN_FLIGHT
        ).values_list("preempted_for_id", flat=True)
    )
    still_pending = set(
        VirtualMachine.objects.filter(pk__in=leaving_for, state=State.PENDING).values_list(
            "pk", flat=True
        )
    )
    for action in waiting:
        if action.vm_id in still_pending:
            continue  # as _still_leaving would find under the lock below
        vm = (
            VirtualMachine.objects.select_for_update(of=("self",), no_key=True)
            .select_related("pool")
            .get(pk=action.vm_id)
        )
        if vm.state != State.PENDING:
            _progress(action, Progress.MISSED, f"{vm.instance_id} is {vm.state}, not pending")
            continue
        if _still_leaving(vm, action):
            continue
        try:
            with transaction.atomic():
                kill_point_on_commit("plans.placements:placed")  # before vm_place's tasks
                placed_at = timezone.now()
                rentals.vm_place(
                    vm=vm,
                    node=action.node,
                    gpu_indices=action.gpus,
                    message=f"plan {action.plan_id}: GPUs freed by its notices",
                )
                placement_flags_copy(vm, action, placed_at=placed_at)
        except (Conflict, ValidationError) as exc:
            reason = exc.message if isinstance(exc, Conflict) else "; ".join(exc.messages)
            _progress(action, Progress.MISSED, reason)
            logger.info("plan %s could not place %s: %s", action.plan_id, vm.instance_id, reason)
            continue
        _progress(action, Progress.DONE)
        placed.append(vm.pk)
    return placed


def _still_leaving(vm: VirtualMachine, action: PlanAction) -> bool:
    """Whether a VM on its way out still holds GPUs the placement needs, or still stops for it."""
    if VirtualMachine.objects.filter(preempted_for=vm, state__in=IN_FLIGHT).exists():
        return True
    return Allocation.objects.filter(
        released_at=None,
        gpu__node_id=action.node_id,
        gpu__index__in=action.gpus,
        vm__state__in=IN_FLIGHT,
    ).exists()


# --- modes ---------------------------------------------------------------------------------------


@transaction.atomic
def capacity_set_set_mode(*, capacity_set: CapacitySet, mode: str, actor: Actor) -> CapacitySet:
    """Switch a set between ``dry_run`` (plans are only shown) and ``enforce`` (every plan is
    applied as it is made). Back in dry-run, notices already sent keep their deadlines and
    approved placements still complete; nothing new is done."""
    if mode not in Mode.values:
        raise ValidationError({"mode": f"must be one of {', '.join(Mode.values)}, got {mode!r}"})
    locked = CapacitySet.objects.select_for_update(no_key=True).get(pk=capacity_set.pk)
    before = locked.mode
    if before == mode:
        return locked
    locked.mode = mode
    locked.save(update_fields=["mode", "updated_at"])
    proposal = Plan.objects.filter(capacity_set=locked, status=Status.PROPOSED).first()
    audit_record(
        actor=actor,
        verb="capacity_set.mode",
        target=locked,
        before={"mode": before},
        after={"mode": mode},
        message=(
            f"enforcement on; the current plan {proposal.pk} notifies {proposal.preemptions} VM(s)"
            if mode == Mode.ENFORCE and proposal is not None
            else ""
        ),
    )
    if mode == Mode.ENFORCE:
        replan_soon(locked.pk, countdown=0)
    capacity_set.__dict__.update(locked.__dict__)
    return locked


# --- what-if -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WhatIf:
    """What the set's plan would be if ``pool`` asked for ``gpus`` more GPUs in blocks of
    ``block_gpus``. Nothing is stored or changed."""

    pool: Pool
    gpus: int
    block_gpus: int
    served: bool
    actions: list[PlanAction]
    pools: list[dict]
    at: datetime | None = None  # asked about a later instant (its policy), or now

    @property
    def reclaimed(self) -> list[PlanAction]:
        """The preemptions made for the hypothetical demand (not for real pending VMs)."""
        return [
            a
            for a in self.actions
            if a.kind == Kind.PREEMPTION and a.for_subject.startswith(WHAT_IF_PREFIX)
        ]

    @property
    def reclaimed_gpus(self) -> int:
        return sum(len(a.gpus) for a in self.reclaimed)


WHAT_IF_PREFIX = "what-if-"


def plan_what_if(
    *,
    capacity_set: CapacitySet,
    pool: Pool | None,
    gpus: object,
    block_gpus: object,
    at: datetime | None = None,
) -> WhatIf:
    """Preview the plan with one more demand group: ``gpus`` GPUs for ``pool`` in blocks of
    ``block_gpus``, all or nothing, queued after the pool's pending VMs. With ``at``: on
    today's fleet with the policy in force at that instant (the set's schedule and overrides,
    and the replicas a raised minimum asks for then: `snapshot.with_policy`)."""
    errors: dict[str, str] = {}
    if pool is None or pool.capacity_set_id != capacity_set.pk:
        errors["pool"] = f"choose a pool of capacity set {capacity_set.name}"
    sizes = block_sizes(capacity_set.fabric)
    if not _whole(block_gpus) or block_gpus not in sizes:
        errors["block_gpus"] = (
            f"must be one of {', '.join(map(str, sizes))} on {capacity_set.fabric}, "
            f"got {block_gpus!r}"
        )
    total = Gpu.objects.filter(node__capacity_set=capacity_set).count()
    if not _whole(gpus) or gpus < 1:
        errors["gpus"] = f"must be a whole number of GPUs, at least 1, got {gpus!r}"
    elif gpus > total:
        errors["gpus"] = f"the set has {total} GPUs in all; {gpus} can never fit"
    elif "block_gpus" not in errors and gpus % block_gpus:
        errors["gpus"] = f"{gpus} GPUs are not a whole number of {block_gpus}-GPU blocks"
    if at is not None and (not isinstance(at, datetime) or at.tzinfo is None):
        errors["at"] = f"must be a time with a time zone, got {at!r}"
    if errors:
        raise ValidationError(errors)
    now = at or timezone.now()
    extra = [
        am.Demand(
            id=f"{WHAT_IF_PREFIX}{n}",
            group="what-if",
            pool=pool.name,
            gpus=block_gpus,
            requested_at=now + timedelta(microseconds=n),
        )
        for n in range(1, gpus // block_gpus + 1)
    ]
    # The set as a fresh read would give it (kept per generation: snapshot_cache), the asked-for
    # blocks queued last, exactly where consistent_snapshot's extra_demands would put them.
    with collector_paused():  # see gpucap/gcpause.py
        kept = snapshot_cache.set_snapshot(capacity_set, load=consistent_snapshot)
        if at is not None:
            kept = with_policy(kept, set_schedule(capacity_set).policy_at(at), at)
        snap = replace(
            kept, snapshot=replace(kept.snapshot, demands=(*kept.snapshot.demands, *extra), now=now)
        )
        result = arbiter.plan(snap.snapshot)
        actions = plan_actions(None, snap, result)
    served = not any(u.group == "what-if" for u in result.unsatisfied)
    return WhatIf(
        pool=pool,
        gpus=gpus,
        block_gpus=block_gpus,
        served=served,
        actions=actions,
        pools=pool_balances(snap, result),
        at=at,
    )


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- what changed between two plans --------------------------------------------------------------


def plan_changes(old: Plan, new: Plan) -> list[str]:
    """Sentences saying how ``new`` differs from ``old`` (what an operator whose approval was
    refused needs to read before approving again)."""
    lines = []
    before, after = _action_keys(old), _action_keys(new)
    for key in sorted(after - before):
        lines.append(f"now {_key_words(key)}")
    for key in sorted(before - after):
        lines.append(f"no longer {_key_words(key)}")
    if not lines:
        lines.append(
            f"the actions are the same; the set changed in other ways (generation "
            f"{old.generation} -> {new.generation})"
        )
    return lines


def _action_keys(plan: Plan) -> set[tuple]:
    return {
        (a.kind, a.vm.instance_id, a.node.hostname if a.node_id else "", tuple(a.gpus))
        for a in plan.actions.exclude(kind=Kind.UNSATISFIED).select_related("vm", "node")
    }


def _key_words(key: tuple) -> str:
    kind, vm, node, gpus = key
    where = f"GPUs {', '.join(map(str, gpus))} of {node}"
    if kind == Kind.PLACEMENT:
        return f"places {vm} on {where}"
    return f"notifies {vm} on {where}"


# --- retention ----------------------------------------------------------------------


def plans_prune(*, keep: int | None = None) -> int:
    """Delete all but the newest ``keep`` plans of each set (proposed plans and plans with
    placements still waiting are always kept). Returns how many were deleted."""
    keep = settings.PLANS_KEEP_PER_SET if keep is None else keep
    deleted = 0
    for capacity_set_id in CapacitySet.objects.values_list("pk", flat=True):
        old = (
            Plan.objects.filter(capacity_set_id=capacity_set_id)
            .exclude(status=Status.PROPOSED)
            .exclude(actions__progress=Progress.WAITING)
            .order_by("-created_at", "-pk")
            .values_list("pk", flat=True)[keep:]
        )
        _, by_model = Plan.objects.filter(pk__in=list(old)).delete()
        deleted += by_model.get(Plan._meta.label, 0)
    return deleted
