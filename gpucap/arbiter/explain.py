"""Words for people: why each VM is preempted, why each demand waits, and the plan as a table.

Operators read these sentences in the dry-run preview before anything happens, so each one
names the demand, the pools and ranks involved, and the rule (rank, floor, topology) that
decided. The planner calls the ``*_reason`` functions; `render_plan` is the CLI's ``explain``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from gpucap.arbiter.model import Plan, Snapshot
from gpucap.arbiter.topology import ready_shared_gpus

# Categories of partitions that can neither be given nor reclaimed, in the order a partition is
# attributed to one when several apply.
FAILED, PLANNED, NOTIFIED, ON_DEMAND = range(4)
PROTECTED = 4  # held by a VM inside its pool's protection window (rule 3a)
PINNED = 5  # held by a running job that one of its VMs elsewhere keeps whole (whole jobs)
FOREIGN = 6  # held by another tenant's VM on a node dedicated to the demand's tenant
HELD = 7  # held by a VM held inside a reservation in force (reservations, held.py)
CATEGORIES = 8
# A reason lists at most this many VMs or nodes by name.
LISTED_HOLDERS = 8


def block_name(fabric: str, size: int) -> str:
    """'8-GPU partition' on NVSwitch, 'GPU' on PCIe (single cards)."""
    if fabric == "pcie":
        return "GPU"
    return f"{size}-GPU partition"


def preemption_reason(
    *,
    demand: str,
    demand_pool: str,
    demand_rank: int,
    pool: str,
    rank: int,
    floor_gpus: int,
    held_before: int,
    held_after: int,
    deployment: str | None = None,
    replicas_after: int = 0,
    min_replicas: int = 0,
) -> str:
    reason = (
        f"reclaimed for {demand} (pool {demand_pool}, rank {demand_rank}): pool {pool} is rank "
        f"{rank}, below rank {demand_rank}, and stays at or above its floor of "
        f"{_gpus(floor_gpus)} ({held_before} → {held_after})"
    )
    if deployment is not None:
        reason += (
            f"; deployment {deployment} keeps {_replicas(replicas_after)}, minimum {min_replicas}"
        )
    return reason


def job_reason(*, group: str, vms: int, gpus: int) -> str:
    """A running multi-VM job is reclaimed whole: what the reclaim takes of it."""
    return f"reclaimed with its job: reclaims job {group}: {vms} VMs, {_gpus(gpus)}, together"


def floor_reason(*, block: str, pool: str, floor_gpus: int, held: int) -> str:
    return (
        f"no free {block}, and reclaiming one would take pool {pool} below its floor of "
        f"{_gpus(floor_gpus)} (it holds {held})"
    )


def min_replicas_reason(*, block: str, deployment: str, min_replicas: int, replicas: int) -> str:
    return (
        f"no free {block}, and reclaiming one would take deployment {deployment} below its "
        f"minimum of {_replicas(min_replicas)} (it runs {replicas})"
    )


def rank_reason(
    *, block: str, victim_pool: str, victim_rank: int, demand_pool: str, demand_rank: int
) -> str:
    return (
        f"no free {block}, and every reclaimable one holds a VM of pool {victim_pool} "
        f"(rank {victim_rank}) or of a higher-ranked pool; pool {demand_pool} (rank "
        f"{demand_rank}) may only reclaim from pools ranked below it"
    )


def lowest_rank_reason(*, block: str, demand_pool: str, demand_rank: int) -> str:
    return (
        f"no free {block}, and pool {demand_pool} (rank {demand_rank}) ranks lowest in the set, "
        f"so it may reclaim from no one"
    )


def blocked_reason(*, block: str, counts: list[int]) -> str:
    """Every ready partition of the size is held by what the arbiter may not touch."""
    total = sum(counts)
    if counts[ON_DEMAND] == total:
        return (
            f"no node has a free or reclaimable {block}: only on-demand VMs hold the candidate "
            f"partitions, and on-demand VMs are never preempted"
        )
    if counts[NOTIFIED] == total:
        return (
            f"no node has a free or reclaimable {block}: every candidate is reserved for VMs "
            f"already under an interruption notice"
        )
    if counts[PLANNED] == total:
        return (
            f"no node has a free or reclaimable {block}: every candidate was given to a demand "
            f"served earlier in this plan"
        )
    if counts[FAILED] == total:
        return f"no node has a free or reclaimable {block}: every candidate includes a failed GPU"
    if counts[PROTECTED] == total:
        return (
            f"no node has a free or reclaimable {block}: every candidate is held by a VM its "
            f"pool still protects after it started or resumed"
        )
    if counts[PINNED] == total:
        return (
            f"no node has a free or reclaimable {block}: every candidate is held by a running "
            f"job that is reclaimed whole or not at all, and another of its VMs may not be "
            f"preempted"
        )
    if counts[FOREIGN] == total:
        return (
            f"no node has a free or reclaimable {block}: every candidate is held by a VM of "
            f"another tenant on a node dedicated to this tenant, which the arbiter leaves alone"
        )
    if counts[HELD] == total:
        return (
            f"no node has a free or reclaimable {block}: every candidate is held by VMs held "
            f"inside tenants' reservations, which are not reclaimed while those are in force"
        )
    parts = []
    if counts[ON_DEMAND]:
        parts.append(f"{counts[ON_DEMAND]} {_hold(counts[ON_DEMAND])} on-demand VMs")
    if counts[NOTIFIED]:
        parts.append(f"{counts[NOTIFIED]} {_are(counts[NOTIFIED])} reserved for VMs under notice")
    if counts[PLANNED]:
        parts.append(
            f"{counts[PLANNED]} {_were(counts[PLANNED])} given to demands served earlier in "
            f"this plan"
        )
    if counts[FAILED]:
        parts.append(f"{counts[FAILED]} {_include(counts[FAILED])} a failed GPU")
    if counts[PROTECTED]:
        parts.append(f"{counts[PROTECTED]} {_are(counts[PROTECTED])} held by protected VMs")
    if counts[PINNED]:
        parts.append(
            f"{counts[PINNED]} {_are(counts[PINNED])} held by jobs that cannot be reclaimed whole"
        )
    if counts[FOREIGN]:
        parts.append(
            f"{counts[FOREIGN]} {_are(counts[FOREIGN])} held by other tenants' VMs on this "
            f"tenant's dedicated nodes"
        )
    if counts[HELD]:
        parts.append(f"{counts[HELD]} {_are(counts[HELD])} held by VMs inside reservations")
    return (
        f"no node has a free or reclaimable {block}: of {total} candidates on ready nodes, "
        + ", ".join(parts)
    )


def _hold(count: int) -> str:
    return "holds" if count == 1 else "hold"


def _are(count: int) -> str:
    return "is" if count == 1 else "are"


def _were(count: int) -> str:
    return "was" if count == 1 else "were"


def _include(count: int) -> str:
    return "includes" if count == 1 else "include"


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def _replicas(count: int) -> str:
    return f"{count} replica" if count == 1 else f"{count} replicas"


def no_block_reason(*, block: str, unready_nodes: int) -> str:
    article = "an" if block[0] == "8" else "a"
    reason = f"no ready node has {article} {block}"
    if unready_nodes:
        noun = "node that has one is" if unready_nodes == 1 else "nodes that have one are"
        reason += f" ({unready_nodes} {noun} cordoned, draining or down)"
    return reason


def protected_reason(
    *, until: datetime, now: datetime | None, pool: str, protect_seconds: int
) -> str:
    """A demand that only protected VMs could serve (rule 3a): when it may go ahead."""
    return (
        f"waits: the VMs it could reclaim are protected until {clock(until, now)} (pool {pool} "
        f"protects VMs for {protect_seconds} s after they start or resume)"
    )


def held_reason(*, holders: list[tuple[str, int, str]]) -> str:
    """A demand that only VMs held inside reservations could serve (rule 4 of reservations):
    ``holders`` are (tenant, GPUs held, reservation id)."""
    held = ", ".join(
        f"tenant {tenant} holds {_gpus(gpus)} inside its reservation {rid}"
        for tenant, gpus, rid in holders
    )
    noun, verb = ("a reservation", "it is") if len(holders) == 1 else ("reservations", "they are")
    return (
        f"waits: the VMs it could reclaim are held inside {noun}: {held}; they are not "
        f"reclaimed while {verb} in force"
    )


def clock(moment: datetime, now: datetime | None = None) -> str:
    """'14:05 UTC' (seconds only when not zero; the date too when not ``now``'s day)."""
    moment = moment.astimezone(UTC)
    text = moment.strftime("%H:%M:%S" if moment.second else "%H:%M") + " UTC"
    if now is None or now.astimezone(UTC).date() != moment.date():
        text = moment.strftime("%Y-%m-%d ") + text
    return text


def quota_reason(
    *, tenant: str, scope: str, max_gpus: int, held: int, holders: list[str], asked: int
) -> str:
    """A group its tenant's quota has no room for: the quota, what holds it, what is asked."""
    listed = ", ".join(holders[:LISTED_HOLDERS])
    if len(holders) > LISTED_HOLDERS:
        listed += f" and {len(holders) - LISTED_HOLDERS} more"
    holding = f"it holds {held}" + (f" ({listed})" if holders else "")
    return (
        f"tenant {tenant}'s {scope} is {_gpus(max_gpus)}; {holding} and this group asks for {asked}"
    )


def dedicated_reason(*, block: str, nodes: list[str]) -> str:
    """What a demand could not use: free partitions on nodes dedicated to other tenants."""
    count = len(nodes)
    listed = ", ".join(nodes[:LISTED_HOLDERS])
    if count > LISTED_HOLDERS:
        listed += f" and {count - LISTED_HOLDERS} more"
    noun = "node has" if count == 1 else "nodes have"
    return f"{count} {noun} a free {block} but {_are(count)} dedicated to other tenants ({listed})"


def group_reason(*, group: str, demand: str, gpus: int, reason: str) -> str:
    return (
        f"group {group} could not be placed whole: demand {demand} ({_gpus(gpus)}) cannot be "
        f"placed: {reason}"
    )


def render_plan(snapshot: Snapshot, plan: Plan) -> str:
    """The plan as text tables for a terminal: placements, preemptions, pools, unsatisfied."""
    capacity_set = snapshot.capacity_set
    now = snapshot.now
    lines = [
        f"Plan for capacity set {capacity_set.name} ({capacity_set.fabric}, "
        f"{capacity_set.gpu_model})" + (f" at {_time(now)}" if now else ""),
        "complete: yes" if plan.complete else f"complete: no ({len(plan.unsatisfied)} unsatisfied)",
        "",
        f"Placements ({len(plan.placements)})",
    ]
    rows = [
        (p.demand, p.node, _indices(p.gpus), ", ".join(p.preempts) or "-") for p in plan.placements
    ]
    if plan.reservations:  # which placements claim a reservation or borrow from one
        lines += _table(
            ("demand", "node", "gpus", "preempts", "reservation"),
            [(*row, _reserved(p)) for row, p in zip(rows, plan.placements, strict=True)],
        )
    else:
        lines += _table(("demand", "node", "gpus", "preempts"), rows)
    started = {vm.id: vm.started_at for vm in snapshot.vms}
    lines += ["", f"Preemptions ({len(plan.preemptions)})"]
    lines += _table(
        ("vm", "tenant", "pool", "node", "gpus", "running", "for", "reason"),
        [
            (
                p.vm,
                p.tenant or "-",
                p.pool,
                p.node,
                _indices(p.gpus),
                _running(now, started.get(p.vm)),
                p.for_demand,
                p.reason,
            )
            for p in plan.preemptions
        ],
    )
    kinds = {pool.name: pool.kind for pool in snapshot.pools}
    lines += ["", "Pools"]
    lines += _table(
        ("rank", "pool", "kind", "floor", "before", "after"),
        [
            (
                str(b.rank),
                b.name,
                kinds.get(b.name, "-"),
                str(b.floor_gpus),
                str(b.before_gpus),
                str(b.after_gpus),
            )
            for b in plan.pools
        ],
    )
    if snapshot.quotas:
        lines += ["", "Quotas"]
        lines += _table(("tenant", "pool", "max", "before", "after"), _quota_rows(snapshot, plan))
    if plan.reservations:
        lines += ["", "Reservations"]
        lines += _table(
            ("id", "tenant", "gpus", "block", "held", "kept", "borrowed", "claim reclaims"),
            [
                (
                    r.id,
                    r.tenant,
                    str(r.gpus),
                    str(r.block_gpus),
                    f"{r.held_before} → {r.held_after}",
                    str(r.kept_gpus),
                    ", ".join(r.borrowed) or "-",
                    (", ".join(r.claim_reclaims) or "nothing")
                    + (" (complete)" if r.claim_complete else " (incomplete)"),
                )
                for r in plan.reservations
            ],
        )
        lines += _short_lines(snapshot, plan)
    lines += ["", f"Unsatisfied ({len(plan.unsatisfied)})"]
    lines += _table(
        ("demand", "group", "reason"), [(u.demand, u.group, u.reason) for u in plan.unsatisfied]
    )
    return "\n".join(lines) + "\n"


def _short_lines(snapshot: Snapshot, plan: Plan) -> list[str]:
    """Why a reservation is short: the set's ready shared GPUs do not cover what they ask."""
    short = [r for r in plan.reservations if r.short_gpus]
    if not short:
        return []
    room = ready_shared_gpus(snapshot.nodes)
    asked = sum(r.gpus for r in plan.reservations)
    return [""] + [
        f"{r.id}: {_gpus(r.short_gpus)} short: the set has {room} ready GPUs not dedicated to a "
        f"tenant, its reservations ask for {asked} (honoured in the order given, in whole blocks)"
        for r in short
    ]


def _reserved(placement) -> str:
    if placement.reservation is not None:
        return f"claims {placement.reservation}"
    if placement.borrowed is not None:
        return f"borrows from {placement.borrowed}"
    return "-"


def _quota_rows(snapshot: Snapshot, plan: Plan) -> list[tuple[str, ...]]:
    """Per quota: the GPUs its tenant holds in its scope before the plan and after it."""
    demands = {demand.id: demand for demand in snapshot.demands}
    rows = []
    for quota in snapshot.quotas:
        before = sum(
            len(vm.gpus)
            for vm in snapshot.vms
            if vm.tenant == quota.tenant and quota.pool in (None, vm.pool)
        )
        placed = sum(
            len(p.gpus)
            for p in plan.placements
            if demands[p.demand].tenant == quota.tenant
            and quota.pool in (None, demands[p.demand].pool)
        )
        rows.append(
            (
                quota.tenant,
                quota.pool or "(whole set)",
                str(quota.max_gpus),
                str(before),
                str(before + placed),
            )
        )
    return rows


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    if not rows:
        return ["  (none)"]
    widths = [max(len(row[col]) for row in [header, *rows]) for col in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        return ("  " + "  ".join(cells)).rstrip()

    return [line(header), *(line(row) for row in rows)]


def _indices(gpus: tuple[int, ...]) -> str:
    return ",".join(str(index) for index in gpus)


def _time(moment: datetime) -> str:
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _running(now: datetime | None, started_at: datetime | None) -> str:
    if now is None or started_at is None:
        return "-"
    seconds = max(0, int((now - started_at).total_seconds()))
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes = seconds // 60
    if days:
        return f"{days}d {hours}h"
    return f"{hours}h {minutes:02d}m"
