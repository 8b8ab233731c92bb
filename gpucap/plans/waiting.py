"""Why a pending VM waits, and roughly when it starts: what its tenant sees on the VM pages, the
portal and ``/api/vms/`` (``waiting``).

- awaiting operator approval: its set is in dry-run and the set's proposed plan places it;
- GPUs being freed: an applied plan places it once the VMs giving up the GPUs stop; it starts by
  the latest of their notice deadlines;
- protected: the set's plan could serve it only by reclaiming VMs still inside their pool's
  protection window (rule 3a, docs/arbiter.md); it waits until that window ends;
- no capacity: no plan places it; it is number N in its pool's line (pending VMs by request time);
- standalone pools have no arbiter: it waits for free GPUs on the cluster's standalone nodes.

The words name only the VM's own pool, never another tenant's VM. A list costs a fixed number of
queries whatever its length (none when no VM of it is pending).
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime

from django.db.models import Q
from django.utils import timezone

from gpucap.fleet.models import CapacitySet
from gpucap.notices.models import InterruptionNotice
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals.models import VirtualMachine

Kind = PlanAction.Kind
Progress = PlanAction.Progress
State = VirtualMachine.State


@dataclass(frozen=True)
class Waiting:
    reason: str  # one of the REASONS below
    message: str
    starts_by: datetime | None = None

    def as_dict(self) -> dict:
        return asdict(self)


APPROVAL = "awaiting_approval"
FREEING = "gpus_being_freed"
STARTING = "starting"
PROTECTED = "protected"
NO_CAPACITY = "no_capacity"
STANDALONE = "standalone"
REASONS = (APPROVAL, FREEING, STARTING, PROTECTED, NO_CAPACITY, STANDALONE)


def waiting_for(vms: Iterable[VirtualMachine]) -> dict[int, Waiting]:
    """Each pending VM of ``vms`` (by id) with why it waits. The VMs need their ``pool``
    loaded (``select_related``). Two queries (four when an applied plan places one of them),
    whatever the number of VMs."""
    pending = [vm for vm in vms if vm.state == State.PENDING]
    if not pending:
        return {}
    lines = _lines({vm.pool_id for vm in pending})
    placements, protected = _plan_lines({vm.pk for vm in pending})
    starts_by = _starts_by([p for p in placements.values() if p.plan.status == Plan.Status.APPLIED])
    return {
        vm.pk: _why(vm, lines.get(vm.pk, 1), placements.get(vm.pk), starts_by, protected.get(vm.pk))
        for vm in pending
    }


def vm_waiting(vm: VirtualMachine) -> Waiting | None:
    """Why this one VM waits; None when it is not pending."""
    return waiting_for([vm]).get(vm.pk)


def waiting_dicts(vms: Iterable[VirtualMachine]) -> dict[int, dict]:
    """``waiting_for`` as plain dicts: what ``gpucap.rentals.waiting`` asks this module for."""
    return {pk: waiting.as_dict() for pk, waiting in waiting_for(vms).items()}


def annotate_waiting(vms: list[VirtualMachine]) -> list[VirtualMachine]:
    """Set ``vm.waiting`` (a ``Waiting`` or None) on each VM, for the pages."""
    found = waiting_for(vms)
    for vm in vms:
        vm.waiting = found.get(vm.pk)
    return vms


# --- the reads --------------------------------------------------------------------------------


def _lines(pool_ids: set[int]) -> dict[int, int]:
    """Each pending VM of these pools with its place in its pool's line (1 = next)."""
    rows = (
        VirtualMachine.objects.filter(pool_id__in=pool_ids, state=State.PENDING)
        .order_by("pool_id", "requested_at", "id")
        .values_list("id", "pool_id")
    )
    seen: dict[int, int] = defaultdict(int)
    places = {}
    for vm_id, pool_id in rows:
        seen[pool_id] += 1
        places[vm_id] = seen[pool_id]
    return places


def _plan_lines(vm_ids: set[int]) -> tuple[dict[int, PlanAction], dict[int, datetime]]:
    """The placement that will start each VM: one in its set's proposed plan, or one of an
    applied plan still waiting for its victims to stop (the latter wins); and, for VMs a plan
    left waiting for a protection window, when the window ends (the latest plan's word). One
    query."""
    live = (Plan.Status.PROPOSED, Plan.Status.NOTHING, Plan.Status.APPLIED)
    actions = (
        PlanAction.objects.filter(vm_id__in=vm_ids)
        .filter(
            Q(kind=Kind.PLACEMENT, plan__status=Plan.Status.PROPOSED)
            | Q(kind=Kind.PLACEMENT, plan__status=Plan.Status.APPLIED, progress=Progress.WAITING)
            | Q(kind=Kind.UNSATISFIED, plan__status__in=live, waits_until__gt=timezone.now())
        )
        .select_related("plan__capacity_set")
        .order_by("plan__created_at", "plan_id")
    )
    found: dict[int, PlanAction] = {}
    protected: dict[int, datetime] = {}
    for action in actions:
        if action.kind == Kind.UNSATISFIED:
            protected[action.vm_id] = action.waits_until
            continue
        protected.pop(action.vm_id, None)  # a later plan places it after all
        current = found.get(action.vm_id)
        if current is None or current.plan.status != Plan.Status.APPLIED:
            found[action.vm_id] = action
    return found, protected


def _starts_by(placements: list[PlanAction]) -> dict[int, datetime | None]:
    """For each applied placement (by plan action id): the latest deadline of the notices of the
    VMs giving up its GPUs, or None when none of them has a notice."""
    if not placements:
        return {}
    plan_ids = {p.plan_id for p in placements}
    victims = defaultdict(set)  # (plan, beneficiary) -> victim VM ids
    for plan_id, vm_id, for_vm_id in PlanAction.objects.filter(
        plan_id__in=plan_ids, kind=Kind.PREEMPTION
    ).values_list("plan_id", "vm_id", "for_vm_id"):
        victims[(plan_id, for_vm_id)].add(vm_id)
    deadlines = {
        (plan_id, vm_id): deadline
        for plan_id, vm_id, deadline in InterruptionNotice.objects.filter(
            plan_id__in=plan_ids
        ).values_list("plan_id", "vm_id", "deadline")
    }
    result = {}
    for placement in placements:
        times = [
            deadlines[(placement.plan_id, victim)]
            for victim in victims[(placement.plan_id, placement.vm_id)]
            if (placement.plan_id, victim) in deadlines
        ]
        result[placement.pk] = max(times) if times else None
    return result


# --- the words --------------------------------------------------------------------------------


def _why(
    vm: VirtualMachine,
    place: int,
    placement: PlanAction | None,
    starts_by: dict[int, datetime | None],
    protected_until: datetime | None = None,
) -> Waiting:
    pool = vm.pool
    if pool.capacity_set_id is None:
        return Waiting(
            STANDALONE,
            f"waiting for free GPUs on the cluster's standalone nodes; number {place} in line",
        )
    if placement is not None and placement.plan.status == Plan.Status.APPLIED:
        when = starts_by.get(placement.pk)
        if when is None:
            return Waiting(FREEING, "GPUs being freed; starts once they are released")
        return Waiting(FREEING, f"GPUs being freed, starts by {when:%H:%M} UTC", when)
    if placement is not None:
        if placement.plan.capacity_set.mode == CapacitySet.Mode.DRY_RUN:
            return Waiting(
                APPROVAL, "awaiting operator approval: the capacity plan that starts it is proposed"
            )
        return Waiting(STARTING, "capacity found; the capacity arbiter is starting it")
    if protected_until is not None:
        return Waiting(
            PROTECTED,
            f"the GPUs it could be given are held by recently started VMs, protected until "
            f"{protected_until:%H:%M} UTC; it starts then if nothing else changes",
            protected_until,
        )
    return Waiting(NO_CAPACITY, f"no capacity in pool {pool.name}; you are number {place} in line")
