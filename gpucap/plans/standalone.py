"""Placement outside capacity sets (DESIGN.md section 3, last paragraph).

A cluster's standalone pools (in no capacity set) place their pending VMs on free capacity of the
cluster's standalone nodes whose GPU model and fabric are the pool's, by pool rank, then request
time, then id (rule 8). A higher-ranked placement may preempt a standalone **spot** VM with an
immediate stop and no notice, as Kubernetes scheduler preemption does; on-demand and inference
VMs are never preempted here.

There is no second planner: each hardware class (GPU model, fabric) of the cluster's standalone
nodes becomes an arbiter `Snapshot`, and `gpucap.arbiter.plan` decides, with its rules on
topology, free capacity first, floors and least disruption. This module only translates the
database into a snapshot (`gpucap.plans.snapshot`, shared with capacity sets) and the plan into
service calls:

- each preemption -> ``services.vm_preempt`` (the victim stops at once; it goes back to pending
  when it is off, as a persistent spot request);
- a victim that is a member of a running multi-VM job stops with every other running member of
  the job (``jobs.job_member_preempt``): a job never runs in part. Their GPUs are reserved for
  nobody; the placement waits only for the victims the plan chose;
- each placement on GPUs that are free now -> ``services.vm_place``;
- a placement that needs victims waits: its victims point at it (``preempted_for``), their GPUs
  and the free rest of its block are reserved for it, and it gets no second round of victims
  while they stop. When they are off, ``vm_mark_stopped`` sends ``rentals.standalone_place``
  again and the VM is placed then, on free capacity;
- an unsatisfied demand stays pending, its reason logged.

Inside a capacity set placement is the arbiter's (plans, dry-run, notices): VMs of set pools
are never placed here.

Runs for one cluster are serialised by a PostgreSQL transaction-level advisory lock
(``gpucap.locks.STANDALONE``), so two workers never plan the same free GPUs at once; the
partial unique index on live allocations is the last line either way.
"""

import logging
from collections import defaultdict
from dataclasses import dataclass, field, replace

from django.core.exceptions import ValidationError
from django.db import transaction

from gpucap import arbiter, locks
from gpucap.allocation.selectors import snapshot_quotas
from gpucap.arbiter import model as am
from gpucap.errors import Conflict
from gpucap.fleet.models import Node, Pool
from gpucap.plans.snapshot import Hardware, LiveCapacity
from gpucap.rentals import jobs, services
from gpucap.rentals.models import VirtualMachine
from gpucap.tasks import wake_at

logger = logging.getLogger(__name__)

State = VirtualMachine.State

# --- what a run did ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    vm_id: int
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Preempted:
    vm_id: int
    for_vm_id: int
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Unplaced:
    vm_id: int
    reason: str


@dataclass
class PlacementResult:
    """One run for one cluster. ``waiting`` lists VMs whose placement needs victims that are
    stopping (preempted in this run or earlier); ``unsatisfied`` the VMs that stay pending."""

    cluster_id: int
    placed: list[Placed] = field(default_factory=list)
    preempted: list[Preempted] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    unsatisfied: list[Unplaced] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.placed or self.preempted)


# --- the run -------------------------------------------------------------------------------------


@transaction.atomic
def standalone_place(*, cluster_id: int) -> PlacementResult:
    """Place the pending VMs of the cluster's standalone pools (see the module docs). Harmless
    to run at any time and any number of times: a run with nothing new to do changes nothing."""
    # Wait for any other placement run of this cluster; held until this transaction ends.
    locks.xact_lock(locks.STANDALONE, cluster_id)
    result = PlacementResult(cluster_id=cluster_id)
    fleet = LiveCapacity.load(
        nodes=Node.objects.filter(cluster_id=cluster_id, capacity_set__isnull=True),
        pools=Pool.objects.filter(cluster_id=cluster_id, capacity_set__isnull=True),
    )
    for hardware in sorted(fleet.demand_classes()):
        _place_class(fleet, hardware, result)
    return result


def _place_class(fleet: LiveCapacity, hardware: Hardware, result: PlacementResult) -> None:
    gpu_model, fabric = hardware
    snapshot = fleet.snapshot(
        hardware,
        name=f"cluster {result.cluster_id}: standalone {gpu_model} {fabric}",
        # Outside a set only spot VMs may be preempted: on-demand and inference pools enter the
        # snapshot as on_demand, which the arbiter never preempts (rule 1).
        pool_kind=lambda pool: "spot" if pool.kind == Pool.Kind.SPOT else "on_demand",
    )
    pools = [pool for pool in fleet.pools.values() if (pool.gpu_model, pool.fabric) == hardware]
    snapshot = replace(snapshot, quotas=snapshot_quotas(gpu_model=gpu_model, pools=pools))
    problems = arbiter.snapshot_problems(snapshot)
    if problems:
        # Cannot happen through the services; if it does, place nothing rather than guess.
        logger.error(
            "standalone placement in cluster %s for %s %s skipped: %s",
            result.cluster_id,
            gpu_model,
            fabric,
            "; ".join(problems),
        )
        return
    plan = arbiter.plan(snapshot)
    _apply(fleet, plan, result)


# --- plan -> services ----------------------------------------------------------------------------


def _apply(fleet: LiveCapacity, plan: am.Plan, result: PlacementResult) -> None:
    by_instance = fleet.vms_by_instance()
    nodes = {node.hostname: node for node in fleet.nodes.values()}
    # GPUs that victims of this plan still hold: a placement on any of them must wait, even one
    # that preempts nobody itself (a victim's spare GPUs are free capacity for the plan's later
    # placements, but only once the victim is off).
    leaving: dict[str, set[int]] = defaultdict(set)
    for preemption in plan.preemptions:
        leaving[preemption.node].update(preemption.gpus)

    for preemption in plan.preemptions:
        victim, beneficiary = by_instance[preemption.vm], by_instance[preemption.for_demand]
        try:
            services.vm_preempt(vm=victim, for_vm=beneficiary)
        except Conflict as exc:  # it changed state since it was read (its owner stopped it)
            logger.info("%s was not preempted: %s", victim.instance_id, exc)
            continue
        logger.info("%s preempted without notice: %s", victim.instance_id, preemption.reason)
        result.preempted.append(
            Preempted(
                vm_id=victim.pk,
                for_vm_id=beneficiary.pk,
                node=preemption.node,
                gpus=preemption.gpus,
            )
        )
    _stop_whole_jobs(fleet, by_instance, result)

    groups: dict[str, list[am.Placement]] = defaultdict(list)
    for placement in plan.placements:
        vm = by_instance[placement.demand]
        groups[vm.demand_group or vm.instance_id].append(placement)
    for placements in groups.values():
        _place_group(placements, by_instance, nodes, leaving, result)

    for unsatisfied in plan.unsatisfied:
        vm = by_instance[unsatisfied.demand]
        logger.info("%s stays pending: %s", vm.instance_id, unsatisfied.reason)
        result.unsatisfied.append(Unplaced(vm_id=vm.pk, reason=unsatisfied.reason))
    waits = [entry.waits_until for entry in plan.unsatisfied if entry.waits_until is not None]
    if waits:  # place again the moment the first protection a VM waits for ends
        wake_at("rentals.standalone_place", result.cluster_id, min(waits))


class _GroupMissed(Exception):
    def __init__(self, vm: VirtualMachine, reason: str) -> None:
        super().__init__(reason)
        self.vm, self.reason = vm, reason


def _place_group(
    placements: list[am.Placement],
    by_instance: dict[str, VirtualMachine],
    nodes: dict[str, Node],
    leaving: dict[str, set[int]],
    result: PlacementResult,
) -> None:
    """Place the members of one demand group (a VM alone, a multi-VM job, an inference
    scale-up step) on the free GPUs the plan gave them; a member whose GPUs victims still hold
    waits. One savepoint for the group: when one member cannot be placed (someone took its
    GPUs, or changed it, since the run read them), none is, so a job never starts in part.
    Nor does it resume in part: while a member stopped for capacity is still on its way back to
    pending, the others wait for it."""
    first = by_instance[placements[0].demand]
    coming_back = jobs.job_members_resuming(first)
    if coming_back:
        for placement in placements:
            vm = by_instance[placement.demand]
            reason = (
                f"waits for {', '.join(m.instance_id for m in coming_back)} of its job "
                f"{vm.job or vm.demand_group} to stop and ask for capacity again: a job "
                "resumes whole"
            )
            logger.info("%s stays pending: %s", vm.instance_id, reason)
            result.unsatisfied.append(Unplaced(vm_id=vm.pk, reason=reason))
        return
    placed, waiting = [], []
    try:
        with transaction.atomic():
            for placement in placements:
                vm = by_instance[placement.demand]
                if placement.preempts or leaving[placement.node] & set(placement.gpus):
                    logger.info(
                        "%s waits for %s to stop on %s",
                        vm.instance_id,
                        ", ".join(placement.preempts) or "preempted VMs",
                        placement.node,
                    )
                    waiting.append(vm.pk)
                    continue
                node = nodes[placement.node]
                try:
                    services.vm_place(
                        vm=vm,
                        node=node,
                        gpu_indices=placement.gpus,
                        message=f"standalone placement on free GPUs {list(placement.gpus)} of "
                        f"{node.hostname} (pool {vm.pool.name}, rank {vm.pool.rank})",
                    )
                except (Conflict, ValidationError) as exc:
                    # Someone else took the GPUs or changed the VM since it was read (a hand
                    # placement, a terminate); the next run plans again from the new state.
                    reason = exc.message if isinstance(exc, Conflict) else "; ".join(exc.messages)
                    raise _GroupMissed(vm, reason) from exc
                placed.append(Placed(vm_id=vm.pk, node=node.hostname, gpus=placement.gpus))
    except _GroupMissed as missed:
        logger.info("%s was not placed: %s", missed.vm.instance_id, missed.reason)
        for placement in placements:
            vm = by_instance[placement.demand]
            reason = (
                missed.reason
                if vm.pk == missed.vm.pk
                else f"{missed.vm.instance_id} of its group {vm.demand_group} was not placed "
                f"({missed.reason}); the group is placed whole or not at all"
            )
            result.unsatisfied.append(Unplaced(vm_id=vm.pk, reason=reason))
        return
    result.placed.extend(placed)
    result.waiting.extend(waiting)


def _stop_whole_jobs(
    fleet: LiveCapacity, by_instance: dict[str, VirtualMachine], result: PlacementResult
) -> None:
    """Stop the other running members of each job a victim of this run belongs to (but those
    the plan preempted itself)."""
    done = {preempted.vm_id for preempted in result.preempted}
    by_id = {vm.pk: vm for vm in by_instance.values()}
    for preempted in list(result.preempted):
        victim, beneficiary = by_id[preempted.vm_id], by_id[preempted.for_vm_id]
        for member in jobs.job_members_running(victim):
            if member.pk in done:
                continue
            try:
                jobs.job_member_preempt(vm=member, victim=victim, for_vm=beneficiary)
            except Conflict as exc:  # it changed state since it was read
                logger.info("%s of a preempted job was not stopped: %s", member.instance_id, exc)
                continue
            done.add(member.pk)
            logger.info(
                "%s preempted without notice with %s of its job %s",
                member.instance_id,
                victim.instance_id,
                member.job or member.demand_group,
            )
            node_id, gpus = next(iter(fleet.held.get(member.pk, {}).items()), (None, []))
            result.preempted.append(
                Preempted(
                    vm_id=member.pk,
                    for_vm_id=beneficiary.pk,
                    node=fleet.nodes[node_id].hostname if node_id in fleet.nodes else "",
                    gpus=tuple(gpus),
                )
            )
