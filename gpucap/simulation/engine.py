"""simulate(start, profile, ...) -> SimulationResult: a capacity set replayed step by step in
simulated time, with the pure arbiter deciding every placement and reclaim.

Nothing here reads the clock or touches the live system: the same input gives the same result.

Each step at time ``T`` (``start.now + k * step_seconds``), in this order:

1. Notices whose deadline has passed end: the victim's GPUs are free. A reclaimed VM that is
   no inference replica (a spot VM) goes back to pending, as a demand of its own job's group
   that names the node holding its disk, and resumes when placed again, for the rest of its
   duration. VMs whose duration is over end. Placements that waited for victims' GPUs start
   once all their GPUs are free.
2. The policy in force at ``T`` (`gpucap.schedules.calendar.effective`: the pools' ranks and
   floors, the deployments' replica ranges), from the start's own values, the schedule
   entries and the overrides; and the reservations in force at ``T`` (their weekly windows,
   `gpucap.simulation.reservations`). A reservation going out of force clears its borrowers'
   flags, as the live boundary does. The start's quotas hold throughout.
3. The autoscaler's rule per deployment (gpucap.inference.autoscaler) on the router's count at
   the end of the previous step: missing replicas become demands, one group per deployment
   and step; fewer are released once they would have done for the cool-down (at once above
   the maximum in force), pending ones first, then the most recently started.
4. VM arrivals of the pools' curves become demands (fractions carry over to the next step).
5. The arbiter plans, if anything changed since its last plan (a demand, a VM gone, a policy
   boundary, while demands wait: a protection window has ended); with nothing changed the
   same snapshot would give the same plan. Each plan reuses, through one `PlanMemo` for the
   run, what the last derived from the nodes and VMs the steps share (the same plans, faster).
   A preemption is a notice: the VM keeps its GPUs for ``notice_seconds``, then leaves. A
   placement starts at once on free GPUs; one that needs GPUs still held (its victims')
   reserves the free rest of its partition and waits.
6. Each deployment's queue over ``[T, T + step)`` (`queue`), served by its replicas ready at
   ``T`` (a replica is ready ``startup_seconds`` after it starts; one under notice serves
   until its deadline), with the load of the profile at ``T``.

The start's running VMs run on (to the end of the run unless reclaimed); its inference replicas
are ready; its VMs under notice leave ``notice_seconds`` after the start; its demands are
pending. The autoscaler's first signal is the load at the start in flight (rate x service
time), as if the run began in steady state.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta

from gpucap.arbiter.model import Demand, Plan, Snapshot
from gpucap.arbiter.planner import PlanMemo
from gpucap.arbiter.planner import plan as arbiter_plan
from gpucap.arbiter.protection import protected_vms
from gpucap.schedules import calendar
from gpucap.simulation.fleet import Fleet, SimDemand
from gpucap.simulation.profile import Profile
from gpucap.simulation.queue import queue_step, replicas_wanted
from gpucap.simulation.reservations import InForce, ReservationSpec
from gpucap.simulation.result import (
    DeploymentStep,
    Event,
    PlanMade,
    PoolStep,
    SimulationResult,
    Step,
)
from gpucap.simulation.spec import DeploymentSpec, input_problems
from gpucap.simulation.worst import WorstMoments


class SimulationError(ValueError):
    """The input cannot be simulated: ``problems``, one line each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def simulate(
    start: Snapshot,
    profile: Profile,
    *,
    deployments: Mapping[str, DeploymentSpec],
    entries: Iterable[calendar.Entry] = (),
    overrides: Iterable[calendar.Override] = (),
    reservations: Iterable[ReservationSpec] | None = None,
    notice_seconds: int,
    step_seconds: int = 60,
    duration_seconds: int = 86400,
    wait_threshold_seconds: float = 1.0,
    startup_seconds: int = 120,
    keep_plans: bool = False,
    worst_count: int = 5,
    plan_every_step: bool = False,
    on_step: Callable[[int, int], None] | None = None,
) -> SimulationResult:
    """Replay ``profile`` on the set of ``start`` (its ``now`` is the start) for
    ``duration_seconds`` in steps of ``step_seconds``. ``deployments`` (by slug) are the set's
    inference deployments; ``entries`` and ``overrides`` its schedule; ``reservations`` all
    its reservations with their windows (None: those of ``start``, in force throughout).
    ``keep_plans`` keeps
    every plan with its snapshot in the result (tests; a day on a large set holds many).
    ``plan_every_step`` asks the arbiter at every step, as if anything could have changed (tests
    check that planning only on a change misses nothing). ``on_step(done, total)`` is called
    after each step (progress for a caller that stores it; it must not change the input)."""
    specs = (
        tuple(ReservationSpec(r) for r in start.reservations)
        if reservations is None
        else tuple(reservations)
    )
    problems = input_problems(
        start,
        profile,
        deployments=deployments,
        notice_seconds=notice_seconds,
        step_seconds=step_seconds,
        duration_seconds=duration_seconds,
        wait_threshold_seconds=wait_threshold_seconds,
        startup_seconds=startup_seconds,
        reservations=tuple(spec.reservation for spec in specs),
    )
    if problems:
        raise SimulationError(problems)
    run = _Run(
        start,
        profile,
        deployments=dict(deployments),
        entries=tuple(entries),
        overrides=tuple(overrides),
        reservations=specs,
        notice=timedelta(seconds=notice_seconds),
        step_seconds=step_seconds,
        steps=-(-duration_seconds // step_seconds),
        wait_threshold_seconds=wait_threshold_seconds,
        startup=timedelta(seconds=startup_seconds),
        keep_plans=keep_plans,
        worst_count=worst_count,
        plan_every_step=plan_every_step,
    )
    return run.result(on_step)


class _Scaler:
    """The autoscaler's memory of one deployment, and its queue."""

    __slots__ = ("asked", "desired", "last_scaled", "queue", "signal", "since")

    def __init__(self, signal: float) -> None:
        self.signal = signal
        self.queue = 0.0
        self.since: datetime | None = None
        self.last_scaled: datetime | None = None
        self.asked = 0
        self.desired = 0


class _Run:
    def __init__(
        self,
        start: Snapshot,
        profile: Profile,
        *,
        deployments: dict[str, DeploymentSpec],
        entries: tuple[calendar.Entry, ...],
        overrides: tuple[calendar.Override, ...],
        reservations: tuple[ReservationSpec, ...],
        notice: timedelta,
        step_seconds: int,
        steps: int,
        wait_threshold_seconds: float,
        startup: timedelta,
        keep_plans: bool,
        worst_count: int,
        plan_every_step: bool,
    ) -> None:
        self.start = start
        self.profile = profile
        self.specs = deployments
        self.entries, self.overrides = entries, overrides
        self.notice, self.startup = notice, startup
        self.step = timedelta(seconds=step_seconds)
        self.step_seconds = step_seconds
        self.steps = steps
        self.threshold = wait_threshold_seconds
        self.keep_plans = keep_plans
        self.plan_every_step = plan_every_step
        self.t0: datetime = start.now  # type: ignore[assignment]
        self.base = calendar.Base(
            pools={pool.name: (pool.rank, pool.floor_gpus) for pool in start.pools},
            deployments={
                slug: (spec.min_replicas, spec.max_replicas) for slug, spec in deployments.items()
            },
        )
        self.boundaries = calendar.boundaries(
            entries, overrides, self.t0, self.t0 + self.step * steps
        )
        self.policy = calendar.effective(self.base, entries, overrides, self.t0)
        self.reservations = InForce(reservations, self.t0, self.t0 + self.step * steps)
        self.fleet = Fleet(start, deployments=deployments, notice=notice, startup=startup)
        self.records: list[Step] = []
        self.plans: list[PlanMade] = []
        self.plans_made = 0
        self.last_made: PlanMade | None = None
        # Steps share most nodes and VMs: each plan reuses what the last derived from them.
        self.memo = PlanMemo()
        self.wake: datetime | None = None
        self.arrival_debt = dict.fromkeys(profile.pools, 0.0)
        self.arrived = 0
        self.worst = WorstMoments(worst_count)
        self.scalers = {
            slug: _Scaler(self._rate(slug, 0) * self._service(slug)) for slug in deployments
        }

    # -- the run ---------------------------------------------------------------------------

    def result(self, on_step: Callable[[int, int], None] | None = None) -> SimulationResult:
        for index in range(self.steps):
            self._step(index, self.t0 + self.step * index)
            if on_step is not None:
                on_step(index + 1, self.steps)
        return SimulationResult(
            start=self.t0,
            step_seconds=self.step_seconds,
            steps=tuple(self.records),
            events=tuple(self.fleet.events),
            worst=self.worst.moments(),
            plans_made=self.plans_made,
            plans=tuple(self.plans),
        )

    def _step(self, index: int, now: datetime) -> None:
        changed = index == 0 or self.plan_every_step
        self.fleet.resumes = 0
        changed |= self.fleet.leave(now)
        changed |= self._policy_at(now)
        # A reservation coming into or going out of force plans the set at once, as the live
        # boundary does, demands or not: the plan reports who borrows it from then on.
        reserved = self._reservations_at(now)
        changed |= reserved
        changed |= self._autoscale(now, index)
        changed |= self._arrivals(now, index)
        if self.wake is not None and self.wake <= now:
            changed = True
        notices = 0
        planned = (changed and bool(self.fleet.pending)) or reserved
        if planned:
            notices = self._plan(index, now)
        elif changed:
            self.wake = None
        self._queues(now, index)
        self._record(index, now, notices, planned=planned)

    # -- policy, autoscaler, arrivals ------------------------------------------------------------

    def _policy_at(self, now: datetime) -> bool:
        crossed = False
        while self.boundaries and self.boundaries[0] <= now:
            self.boundaries.pop(0)
            crossed = True
        if not crossed:
            return False
        policy = calendar.effective(self.base, self.entries, self.overrides, now)
        lines = self.policy.differences(policy)
        self.policy = policy
        for line in lines:
            self.fleet.events.append(Event(now, "policy", reason=line))
        return bool(lines)

    def _reservations_at(self, now: datetime) -> bool:
        started, ended = self.reservations.step(now)
        for rid in started:
            words = self.reservations.words(rid)
            self.fleet.events.append(Event(now, "reservation", reason=f"{words} in force"))
        for rid in ended:
            words = self.reservations.words(rid)
            self.fleet.events.append(Event(now, "reservation", reason=f"{words} ended"))
        if ended:
            self.fleet.borrowing_set(
                {key: rid for key, rid in self.fleet.borrowing.items() if rid not in ended}
            )
        return bool(started or ended)

    def _autoscale(self, now: datetime, index: int) -> bool:
        changed = False
        asked = dict.fromkeys(self.specs, 0)
        for demand in (
            *self.fleet.pending.values(),
            *(d for d, _, _ in self.fleet.waiting.values()),
        ):
            if demand.deployment is not None:
                asked[demand.deployment] += 1
        for slug, spec in self.specs.items():
            scaler = self.scalers[slug]
            low, high = self.policy.replicas[slug]
            desired = replicas_wanted(scaler.signal, spec.target_in_flight, low, high)
            scaler.desired = desired
            live = asked[slug] + sum(
                1 for vm in self.fleet.replicas[slug].values() if vm.state == "running"
            )
            if desired > live:
                self._ask(slug, spec, desired - live, now, index)
                scaler.last_scaled, scaler.since = now, None
                changed = True
            elif live > high:
                self.fleet.release(slug, live - desired)
                scaler.last_scaled, scaler.since = now, None
                changed = True
            elif desired == live:
                scaler.since = None
            elif scaler.since is None:
                scaler.since = now
            else:
                cooldown = timedelta(seconds=spec.scale_down_cooldown_seconds)
                scaled = scaler.last_scaled
                if now - scaler.since >= cooldown and (scaled is None or now - scaled >= cooldown):
                    self.fleet.release(slug, live - desired)
                    scaler.last_scaled, scaler.since = now, None
                    changed = True
        return changed

    def _ask(self, slug: str, spec: DeploymentSpec, count: int, now: datetime, index: int) -> None:
        scaler = self.scalers[slug]
        group = f"sim-{slug}-up-{index}"
        for _ in range(count):
            scaler.asked += 1
            demand = Demand(
                id=f"sim-{slug}-{scaler.asked}",
                group=group,
                pool=spec.pool,
                gpus=spec.gpus_per_replica,
                requested_at=now,
                tenant=spec.tenant,
            )
            self.fleet.pending[demand.id] = SimDemand(
                demand, kind="replica", deployment=slug, tenant=spec.tenant
            )

    def _arrivals(self, now: datetime, index: int) -> bool:
        arrived = False
        offset = index * self.step_seconds
        for name, arrivals in self.profile.pools.items():
            debt = self.arrival_debt[name] + arrivals.vms_per_hour.at(offset) * (
                self.step_seconds / 3600
            )
            count = int(debt + 1e-9)
            self.arrival_debt[name] = debt - count
            for _ in range(count):
                self.arrived += 1
                demand = Demand(
                    id=f"sim-{name}-vm-{self.arrived}",
                    group=f"sim-{name}-vm-{self.arrived}",
                    pool=name,
                    gpus=arrivals.gpus_per_vm,
                    requested_at=now,
                    tenant=arrivals.tenant,
                )
                self.fleet.pending[demand.id] = SimDemand(
                    demand,
                    kind="arrival",
                    duration=timedelta(seconds=arrivals.duration_seconds),
                    tenant=arrivals.tenant,
                )
                arrived = True
        return arrived

    def _rate(self, slug: str, offset: float) -> float:
        load = self.profile.deployments.get(slug)
        return load.requests.at(offset) if load is not None else 0.0

    def _service(self, slug: str) -> float:
        load = self.profile.deployments.get(slug)
        return load.service_seconds if load is not None else 1.0

    # -- the arbiter -----------------------------------------------------------------------------

    def _plan(self, index: int, now: datetime) -> int:
        """Plan the step's snapshot and act on it; returns the notices issued."""
        snapshot = self.fleet.snapshot(now, self.policy, self.specs, self.reservations.now)
        made = _plan_quietly(snapshot, self.memo)
        self.plans_made += 1
        record = PlanMade(step=index, snapshot=snapshot, plan=made)
        self.last_made = record
        if self.keep_plans:
            self.plans.append(record)
        flagged = self.fleet.apply(made, now)
        waits = []
        if made.unsatisfied:
            waits += _protection_ends(snapshot, made)
            if flagged:  # borrowers flagged: the next plan claims them, as the live set's does
                waits.append(now)
        if made.preemptions and not self.fleet.notice:
            waits.append(now)  # victims left at once: their resumes are planned next step
        self.wake = min(waits) if waits else None
        if made.preemptions:
            pools: dict[str, int] = {}
            for preemption in made.preemptions:
                pools[preemption.pool] = pools.get(preemption.pool, 0) + 1
            where = ", ".join(f"{pool} {count}" for pool, count in pools.items())
            self.worst.offer(
                "notices",
                step=index,
                at=now,
                value=len(made.preemptions),
                words=(
                    f"{_count(len(made.preemptions), 'notice')} at {now:%Y-%m-%d %H:%M} ({where})"
                ),
                made=record,
            )
        return len(made.preemptions)

    # -- queues and records ----------------------------------------------------------------------

    def _queues(self, now: datetime, index: int) -> None:
        offset = index * self.step_seconds
        self.step_queues: list[DeploymentStep] = []
        asked: dict[str, int] = {}
        for demand in self.fleet.asking():
            if demand.deployment is not None:
                asked[demand.deployment] = asked.get(demand.deployment, 0) + 1
        worst: tuple[float, DeploymentStep] | None = None
        for slug, spec in self.specs.items():
            scaler = self.scalers[slug]
            rate = self._rate(slug, offset)
            ready = sum(1 for vm in self.fleet.replicas[slug].values() if vm.ready_at <= now)
            low, high = self.policy.replicas[slug]
            found = queue_step(
                queue_before=scaler.queue,
                rate=rate,
                seconds=self.step_seconds,
                ready=ready,
                replica_concurrency=spec.replica_concurrency,
                service_seconds=self._service(slug),
                queue_limit=spec.queue_limit,
                wait_threshold_seconds=self.threshold,
            )
            scaler.queue, scaler.signal = found.queue_after, found.signal
            live = asked.get(slug, 0) + sum(
                1 for vm in self.fleet.replicas[slug].values() if vm.state == "running"
            )
            record = DeploymentStep(
                deployment=slug,
                rps=rate,
                replicas=live,
                ready=ready,
                desired=scaler.desired,
                min_replicas=low,
                max_replicas=high,
                queue=found.queue_after,
                wait_p99_seconds=found.wait_p99_seconds,
                arrived=found.arrived,
                refused=found.refused,
                over_threshold=found.over_threshold,
            )
            self.step_queues.append(record)
            wait = found.wait_p99_seconds
            key = float("inf") if wait is None else wait
            if key > 0 and (worst is None or key > worst[0]):
                worst = (key, record)
        if worst is not None:
            record = worst[1]
            wait = record.wait_p99_seconds
            shown = "unbounded (no replica ready)" if wait is None else f"{wait:.1f} s"
            self.worst.offer(
                "wait",
                step=index,
                at=now,
                value=wait,
                words=(
                    f"{record.deployment} p99 queue wait {shown} at {now:%Y-%m-%d %H:%M}: "
                    f"{record.rps:g} requests/s, {_count(record.ready, 'replica')} ready of "
                    f"{record.replicas}, {record.queue:.0f} queued, {record.refused:.0f} refused"
                ),
                made=self.last_made,
            )

    def _record(self, index: int, now: datetime, notices: int, *, planned: bool) -> None:
        pending = dict.fromkeys(self.fleet.held, 0)
        for demand in (
            *self.fleet.pending.values(),
            *(d for d, _, _ in self.fleet.waiting.values()),
        ):
            pending[demand.frozen.pool] = pending.get(demand.frozen.pool, 0) + demand.frozen.gpus
        pools = tuple(
            PoolStep(
                pool=pool.name,
                rank=self.policy.ranks[pool.name],
                held_gpus=self.fleet.held[pool.name],
                floor_gpus=self.policy.floors[pool.name],
                pending_gpus=pending[pool.name],
            )
            for pool in self.start.pools
        )
        self.records.append(
            Step(
                index=index,
                at=now,
                deployments=tuple(self.step_queues),
                pools=pools,
                notices=notices,
                resumes=self.fleet.resumes,
                planned=planned,
            )
        )


def _plan_quietly(snapshot: Snapshot, memo: PlanMemo) -> Plan:
    """The arbiter's plan, with the cyclic garbage collector paused while it is made, as the
    CLI pauses it: a plan builds tens of thousands of short-lived objects (freed by reference
    counting when it is made), and collections during it would promote them and, every few
    steps, rescan the whole simulation's objects: about half of a day's run."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return arbiter_plan(snapshot, memo=memo)
    finally:
        if collecting:
            gc.enable()


def _protection_ends(snapshot: Snapshot, made: Plan) -> list[datetime]:
    """When protection windows end that may let a waiting demand reclaim (their VMs rank below
    it): the live arbiter, planning every few seconds, would see that at once."""
    rank = {pool.name: pool.rank for pool in snapshot.pools}
    demand_pool = {demand.id: demand.pool for demand in snapshot.demands}
    best = min(rank[demand_pool[entry.demand]] for entry in made.unsatisfied)
    vm_pool = {vm.id: vm.pool for vm in snapshot.vms}
    return [end for vm_id, end in protected_vms(snapshot).items() if rank[vm_pool[vm_id]] > best]


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}" if number == 1 else f"{number} {thing}s"
