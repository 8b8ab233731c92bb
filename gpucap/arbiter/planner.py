"""plan(snapshot) -> Plan: which demands get GPUs now, and which VMs give them up (DESIGN.md §3).

A pure function: no clock, no I/O, no iteration over hash-ordered sets of strings, so the same
snapshot gives the same plan in any process.

How a plan is made
------------------
Demand groups are served in order: the best (lowest) pool rank among the group's demands, then
the group's earliest ``requested_at``, then the group id (rule 8). Inside a group, demands go
largest first (then request time, then id). A group is placed whole or not at all (rule 4):
its placements are tentative until the last demand fits, and are rolled back otherwise.

1. Free capacity first (rule 6): the whole group is tried on free partitions alone. Free
   partitions are chosen best-fit: the one whose taking breaks the fewest free larger
   partitions (counted per size, largest first), then the fewest partitions that a reclaim
   could still free, so whole 8-GPU partitions and cheap reclaims stay available to later
   demands. Only when the group cannot be placed on free capacity alone is it retried with
   reclaims: each demand still takes a free partition if one exists, and otherwise its least
   disruptive legal reclaim. For a single demand that is the exact minimum. For a group of
   several, one demand's choice changes another's (a reclaim frees GPUs another can use, or
   takes the partition another needed, or uses up a floor's headroom), so the group is first
   tried in a few orders (largest first; its lowest-ranked demands first, as they may reclaim
   from fewer pools; then, for groups of up to four, the other orders, comparing up to six
   that work), and then `search.GroupSearch` looks for a strictly less disruptive placement
   by branch and bound, with the best order's placement as its bound. The search is exact
   within a budget of `_SEARCH_BUDGET` expanded states per group; past it the group keeps the
   best placement found by then. Sets of up to `_WHOLE_SET_NODES` ready nodes are searched
   whole; on larger sets the search sees a region (`_Planner._region`). When a size of the
   group has no free partition at all (so that no placement can do without victims), no
   placement costs less than the cheapest single reclaim of the group
   (`_Planner._least_victims`): an order that costs that little ends the trials and stays
   placed, with no search. A group nothing places is reported unsatisfied with the reason of
   its first attempt.
2. A reclaim takes one whole partition of the node's table (rule 5); its victims are forced:
   every VM holding a GPU of that partition. It is legal when no victim is on-demand (rule 1),
   under notice, protected (rule 3a: inside its pool's ``protect_seconds`` after it started or
   resumed; see protection.py), or of a pool ranked at or above the demand's pool (rule 3),
   when it leaves
   every pool at or above its floor and every deployment at or above its ``min_replicas``,
   counting all earlier preemptions of the plan (rule 2), and when the partition has no failed
   GPU and no GPU given earlier in the plan. GPUs a victim frees outside the partition (on its
   node or, for a job's members, on theirs) become free capacity for the rest of the plan.
   Victims include every running member of their jobs (VMs sharing a ``group``): a running
   job is reclaimed whole, wherever its members run, each member a victim checked as above,
   and a job with a member that may not be preempted is never reclaimed.
3. Least disruption (rule 7) is `disruption_cost`, compared as a tuple, smaller first:

       (-(rank of the highest-priority pool among the victims),
        preempted GPUs, preempted VMs, -(sum of the victims' start times))

   that is: the most important pool touched is as unimportant as possible; then fewest GPUs;
   then fewest VMs; then the most recently started VMs (with equal VM counts, the largest sum
   of start times is the least running time lost, whatever ``now`` is). Ties go to the node
   name, then the sorted victim ids, then the partition's place in the table. Among all legal
   (node, partition) pairs the planner takes the true minimum of this order.

4. Disks, once every group is served (`_Planner._prefer_disks`): a placement on free capacity
   whose demand names the node that holds its disk (``disk_node``, a reclaimed spot VM
   waiting to resume) moves there when that node has a partition of the same size that the
   plan leaves free, that was free before it, and that fits at least as well. Being last, it
   is below every rule: it changes where such a VM lands, never who is served or preempted.

5. Whole plan (`improve.whole_plan`): on sets of up to 64 ready nodes, a plan that preempts is
   re-planned with its groups served in other orders and some VMs spared (`_Planner`'s
   ``spared``: illegal victims), within a work budget, and the least disruptive plan (rule 7
   over all its victims) that serves exactly the same demands is kept (rule 8: the order of
   service decides who is served, not how badly).

Indexes keep this fast on fleets of thousands of nodes. Per block size there is a heap of each
node's best-fit free partition, and (built the first time a demand of that size needs a reclaim)
an index of reclaims keyed by the cost above (`_Reclaims`). A node's entries are recomputed only
when that node changes; stale entries carry an old node version and are dropped when they
surface. A node's entries also name its jobs' members elsewhere, but stay correct: a member
only leaves with its whole job, and a reclaim refreshes every node it takes a victim from.
Rank legality needs no separate index: the first element of the cost is minus the
highest-priority victim rank, so when the cheapest legal reclaim touches a pool ranked at or
above the demand, no legal reclaim of that size exists. Floors are global, so reclaims are
grouped by what they take from each pool and deployment: one check decides a whole group, and a
group that would break a floor is parked (for the rest of the plan, or until the rollback of the
attempt that used up the headroom). The cheapest legal reclaim is thus found in O(log n) even
when floors bind everywhere, and it is still the true minimum.

Tenant allocation (issue 19, tenancy.py). Quotas are checked once per group, before it is
tried: what a tenant holds only grows during a plan, so a group its tenant's quotas have no
room for is unsatisfied whole, and nothing is tried or preempted for it. Dedicated nodes get
indexes of their own: per tenant, free heaps and reclaims (`_Reclaims` with a ``tenant``) over
its dedicated nodes only, and the shared indexes never see them. A group is served in its
tenant's scope (`_enter_scope`): free capacity on its dedicated nodes first, then shared; the
cheaper of the two scopes' reclaims; and its search over the shared nodes and its own. Another
tenant's VM on a dedicated node is fixed (never a victim), and a running job with members in
two scopes is kept whole, so a reclaim for one tenant never reaches into another's nodes. A
snapshot without quotas or dedicated nodes takes none of these paths: it is planned exactly as
before, with one shared scope.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from operator import attrgetter

from gpucap.arbiter import explain, improve, protection
from gpucap.arbiter.model import (
    Demand,
    Placement,
    Plan,
    PoolBalance,
    Preemption,
    Snapshot,
    Unsatisfied,
    Vm,
)
from gpucap.arbiter.search import GroupSearch
from gpucap.arbiter.tenancy import QuotaBook
from gpucap.arbiter.topology import FIT_SLOT, gpu_mask, partition_table

__all__ = ["PlanMemo", "disruption_cost", "plan"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ID = attrgetter("id")
_MICROSECOND = timedelta(microseconds=1)
# Groups up to this size that fail in the usual orders are retried in every order.
_MAX_REORDERED_GROUP = 4
# A group placed with reclaims is placed in the least disruptive of up to this many orders.
_MAX_ORDERS_COMPARED = 6
# The exact search of a group's placement (search.py) stops after expanding this many states
# and keeps the best placement found by then (or the order-by-order one), which bounds a
# group's search to a few tenths of a second (a state costs 20-60 µs on the sets searched
# whole). Sets of up to 6 nodes with groups of up to 4 demands, the sizes checked against
# exhaustive search, need a few hundred at most (under 500 over 24,000 random sets of both
# fabrics); groups of 6 demands there mostly stay under 3,000, and the odd one that reaches
# the budget keeps the best placement found.
_SEARCH_BUDGET = 5000
# Sets with at most this many ready nodes are searched whole; larger ones through a region,
# with a smaller budget: there the search is already a bounded look around the planner's own
# placement, and a large set may hold many large groups.
_WHOLE_SET_NODES = 16
_REGION_SEARCH_BUDGET = 1000
# A large set's search region holds, per demand of the group, this many nodes with cheap
# reclaims of the demand's size.
_REGION_RECLAIMS_PER_DEMAND = 2
# What `_Planner._index_node_tables` derives from the nodes alone (a `PlanMemo` keeps them).
_NODE_INDEXES = (
    "node_names",
    "node_position",
    "tables",
    "ready",
    "ready_nodes",
    "node_tenant",
    "dedicated",
    "failed",
)


class PlanMemo:
    """What planning one snapshot derived that planning the next one of the same set can reuse
    (a simulation plans a set at every step, and few of its nodes and VMs change between two):
    pass the same memo to each `plan`. Only what the reused objects alone decide is kept, and
    reused only for the very objects it came from (snapshots are frozen), so a plan with a
    memo is the plan without one; the memo holds the last snapshot's nodes and VMs alive."""

    __slots__ = ("nodes", "reclaims", "vms")

    def __init__(self) -> None:
        # (the snapshot's nodes tuple, its fabric, the node indexes `_Planner` derived).
        self.nodes: tuple | None = None
        # id(Vm) -> (the Vm, what else its `_Vm` was built from, the `_Vm`).
        self.vms: dict[int, tuple[Vm, tuple, _Vm]] = {}
        # (block size, tenant scope, node) -> (what the node's reclaims were found from, them).
        self.reclaims: dict[tuple, tuple[tuple, tuple]] = {}


def plan(
    snapshot: Snapshot, *, memo: PlanMemo | None = None, held: frozenset[str] = frozenset()
) -> Plan:
    """Plan one capacity set. ``snapshot`` must pass `validation.snapshot_problems`. ``memo``:
    see `PlanMemo` (the plan is the same with or without one). ``held``: ids of running VMs
    that are no victims of any demand, like on-demand ones, and are worded as held inside
    reservations (the passes of reservations.py plan snapshots without reservations this way;
    planned without a memo)."""
    if snapshot.reservations:  # planned in passes of this function (reservations.py)
        from gpucap.arbiter.claims import plan_reserved

        return plan_reserved(snapshot, plan)
    planner = _HeldPlanner(snapshot, held=held) if held else _Planner(snapshot, memo=memo)
    first = planner.run()
    result = improve.whole_plan(
        snapshot,
        first,
        order=planner.order,
        ready_nodes=len(planner.ready_nodes),
        states=sum(expanded for expanded, _ in planner.searches),
        replan=lambda order, spared: _replan(snapshot, order, spared | held, memo),
    )
    # Waits that protection causes say until when (rule 3a, protection.py).
    return protection.explain_waits(
        snapshot,
        result,
        lambda: _Planner(snapshot, protect=False, spared=held, memo=memo).run(),
        keep=frozenset(planner.over_quota),
    )


def _replan(
    snapshot: Snapshot, order: list[str], spared: frozenset[str], memo: PlanMemo | None
) -> tuple[Plan, int]:
    """A plan with groups served in ``order`` and ``spared`` VMs kept, and the search states
    it expanded (`improve.whole_plan` counts its work with them)."""
    planner = _Planner(snapshot, spared=spared, memo=memo)
    result = planner.run(order)
    return result, sum(expanded for expanded, _ in planner.searches)


def disruption_cost(victims: Iterable[Vm], pool_rank: Mapping[str, int]) -> tuple[int, ...]:
    """Rule 7 as a sort key for one reclaim: smaller is less disruptive (see module docs)."""
    victims = list(victims)
    if not victims:
        return (0, 0, 0, 0)
    return (
        -min(pool_rank[vm.pool] for vm in victims),
        sum(len(vm.gpus) for vm in victims),
        len(victims),
        -sum(_microseconds(vm.started_at) for vm in victims),
    )


def _microseconds(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND


class _Table:
    """One distinct partition table, shared by every node that has it."""

    __slots__ = ("blocks", "by_size", "fits", "masks", "overlaps", "sizes")

    def __init__(self, blocks: tuple[tuple[int, ...], ...]) -> None:
        self.blocks = tuple(tuple(sorted(block)) for block in blocks)
        self.masks = [gpu_mask(block) for block in blocks]
        self.sizes = [len(block) for block in blocks]
        by_size: dict[int, list[int]] = {}
        for index, size in enumerate(self.sizes):
            by_size.setdefault(size, []).append(index)
        self.by_size = {size: tuple(indexes) for size, indexes in by_size.items()}
        self.overlaps = [
            tuple(
                other
                for other, other_mask in enumerate(self.masks)
                if other != index and other_mask & mask
            )
            for index, mask in enumerate(self.masks)
        ]
        self.fits: dict[tuple[int, int], tuple[tuple[int, tuple[int, ...], int], ...]] = {}

    def free_fits(self, busy: int, fixed: int) -> tuple[tuple[int, tuple[int, ...], int], ...]:
        """For each size with a free block: (size, best-fit key, block index)."""
        fits = self.fits.get((busy, fixed))
        if fits is None:
            fits = self.fits[(busy, fixed)] = self._best_fits(busy, fixed)
        return fits

    def _best_fits(self, busy: int, fixed: int) -> tuple[tuple[int, tuple[int, ...], int], ...]:
        """Best fit: first break the fewest free blocks, largest sizes first; then the fewest
        blocks that a reclaim could still free (busy only with VMs that may be preempted), so
        cheap reclaims stay available to later demands."""
        masks = self.masks
        free = [index for index, mask in enumerate(masks) if not mask & busy]
        is_free = [False] * len(masks)
        for index in free:
            is_free[index] = True
        best: dict[int, tuple[tuple[int, ...], int]] = {}
        for index in free:
            key = (self._broken(index, is_free, fixed), index)
            size = self.sizes[index]
            if size not in best or key < best[size]:
                best[size] = key
        return tuple((size, key, index) for size, (key, index) in sorted(best.items()))

    def fit_key(self, busy: int, fixed: int, index: int) -> tuple[int, ...]:
        """The best-fit key (see `_best_fits`, without the block's place) of taking free block
        ``index`` when ``busy`` and ``fixed`` are the node's GPUs."""
        is_free = [not mask & busy for mask in self.masks]
        return self._broken(index, is_free, fixed)

    def _broken(self, index: int, is_free: list[bool], fixed: int) -> tuple[int, ...]:
        broken = [0] * 8
        for other in self.overlaps[index]:
            if is_free[other]:
                broken[FIT_SLOT[self.sizes[other]]] += 1
            elif not self.masks[other] & fixed:
                broken[4 + FIT_SLOT[self.sizes[other]]] += 1
        return tuple(broken)


class _Vm:
    """A running VM as the planner sees it."""

    __slots__ = (
        "deployment",
        "gpus",
        "group",
        "id",
        "mask",
        "mates",
        "ngpus",
        "node",
        "pool",
        "rank",
        "started",
        "take",
        "tenant",
    )

    def __init__(
        self, vm: Vm, pool: int, rank: int, deployment: int | None, node: int, mask: int
    ) -> None:
        self.id = vm.id
        self.pool = pool
        self.rank = rank
        self.deployment = deployment
        self.node = node
        gpus = vm.gpus
        self.gpus = tuple(sorted(gpus))
        self.mask = mask
        self.ngpus = ngpus = len(gpus)
        self.started = (vm.started_at - _EPOCH) // _MICROSECOND  # _microseconds, inline

        self.tenant = vm.tenant
        self.group = vm.group
        # The other running members of its job, reclaimed with it (see `_with_mates`).
        self.mates: tuple[_Vm, ...] = ()
        # What preempting this VM alone takes (see _Reclaims).
        self.take = (
            ((pool, ngpus),) if deployment is None else ((pool, ngpus), (-1 - deployment, 1))
        )


class _Reclaims:
    """Every ready node's reclaims of one block size, cheapest first.

    Reclaims are grouped by their take: the GPUs they take from each pool and the replicas
    from each deployment, a tuple ``((pool, gpus), ..., (-1 - deployment, replicas), ...)``.
    All reclaims with one take break a floor together or not at all, so a floor check decides
    a whole group at once: a group that would break one is parked, and planning never walks
    through reclaims that a floor forbids one by one. Each group is a heap holding each node's
    cheapest reclaim of that take; ``tops`` holds each unparked group's best, so the cheapest
    legal reclaim overall is found in O(log n). Entries of a node that changed carry an old
    version and are dropped when they surface.
    """

    def __init__(self, planner: _Planner, size: int, tenant: str | None = None) -> None:
        self.planner = planner
        self.size = size
        # Whose nodes it indexes: the shared ones (None) or those dedicated to this tenant.
        self.tenant = tenant
        count = len(planner.node_names)
        self.heaps: dict[tuple, list] = {}
        self.tops: list[tuple[tuple, tuple]] = []
        self.parked: dict[tuple, tuple] = {}  # take -> the floor it would break
        self.parked_tops: list[tuple[tuple, tuple]] = []  # like tops, for parked takes
        self.victims: list[dict[int, list[_Vm]]] = [{} for _ in range(count)]
        self.cheapest_at: list[dict[tuple, tuple]] = [{} for _ in range(count)]
        self.node_blocked: list[tuple[int, ...]] = [(0,) * explain.CATEGORIES] * count
        # Ready partitions no reclaim can free, by explain category.
        self.blocked = [0] * explain.CATEGORIES
        self.unready = 0  # nodes not ready that have partitions of this size
        node_tenant = planner.node_tenant
        for node, table in enumerate(planner.tables):
            if node_tenant[node] != tenant:
                continue
            if planner.ready[node]:
                self.index(node, initial=True)
            elif size in table.by_size:
                self.unready += 1
        for heap in self.heaps.values():
            heapq.heapify(heap)
        self.tops = [(heap[0][0], take) for take, heap in self.heaps.items() if heap]
        heapq.heapify(self.tops)

    def index(self, node: int, *, initial: bool = False) -> None:
        """(Re)compute a node's reclaims: its cheapest per take, pushed into that take's heap."""
        planner = self.planner
        table = planner.tables[node]
        fixed = planner.fixed[node]
        busy = planner.busy[node]
        vms = planner.node_vms[node]
        jobs = node in planner.job_nodes
        memo = planner.memo
        if initial and memo is not None and not jobs:
            # Everything the node's reclaims follow from (the blocker masks included; the VMs
            # by identity, see `PlanMemo`): the same as when the memo's state was found, the
            # same state. Jobs' members also depend on their mates elsewhere: never kept.
            inputs = (
                table,
                busy,
                fixed,
                planner.failed[node],
                planner.placed[node],
                planner.notified[node],
                planner.protected_gpus[node],
                planner.pinned_gpus[node],
                planner.foreign_gpus[node],
                tuple(vms),
            )
            where = (self.size, self.tenant, node)
            last = memo.reclaims.get(where)
            if last is not None and last[0] == inputs:
                self._publish(node, last[1], initial=True)
                return
            state = self._found(node, table, fixed, busy, vms, jobs)
            memo.reclaims[where] = (inputs, state)
            self._publish(node, state, initial=True)
            return
        self._publish(node, self._found(node, table, fixed, busy, vms, jobs), initial=initial)

    def _found(
        self, node: int, table: _Table, fixed: int, busy: int, vms: list[_Vm], jobs: bool
    ) -> tuple:
        """A node's reclaims of this size: (cheapest key per take, victims per block, blocked
        partitions per explain category)."""
        planner = self.planner
        blocked = [0] * explain.CATEGORIES
        victims_at: dict[int, list[_Vm]] = {}
        cheapest: dict[tuple, tuple] = {}
        for block in table.by_size.get(self.size, ()):
            mask = table.masks[block]
            if mask & fixed:
                blocked[planner.blocker(node, mask)] += 1
                continue
            if not mask & busy:
                continue  # free: the free heap offers it
            victims = [vm for vm in vms if vm.mask & mask]
            if jobs:
                victims = _with_mates(victims)
            if len(victims) == 1:
                vm = victims[0]
                key = (-vm.rank, vm.ngpus, 1, -vm.started, node, (vm.id,), block)
                take = vm.take
            else:
                victims.sort(key=_ID)
                key, take = _reclaim_key(victims, node, block)
            victims_at[block] = victims
            if take not in cheapest or key < cheapest[take]:
                cheapest[take] = key
        return cheapest, victims_at, tuple(blocked)

    def state(self, node: int) -> tuple:
        """What `index` last found on the node, for `restore`."""
        return self.cheapest_at[node], self.victims[node], self.node_blocked[node]

    def restore(self, node: int, state: tuple) -> None:
        """Index the node again from ``state`` (`state` taken while the node held the GPUs and
        VMs it holds now): a rollback puts nodes back as they were, and their reclaims with
        them, without working them out again. The node's reclaims depend on nothing else: a
        job's members elsewhere only ever leave together with the whole job."""
        self._publish(node, state)

    def _publish(self, node: int, state: tuple, *, initial: bool = False) -> None:
        cheapest, victims_at, blocked = state
        self.cheapest_at[node] = cheapest
        self.victims[node] = victims_at
        old = self.node_blocked[node]
        if blocked != old:
            for category in range(explain.CATEGORIES):
                self.blocked[category] += blocked[category] - old[category]
            self.node_blocked[node] = blocked
        version = self.planner.version[node]
        heaps = self.heaps
        if initial:  # heapified once every node is in (see __init__)
            for take, key in cheapest.items():
                heap = heaps.get(take)
                if heap is None:
                    heap = heaps[take] = []
                heap.append((key, version))
            return
        for take, key in cheapest.items():
            heap = heaps.setdefault(take, [])
            entry = (key, version)
            heapq.heappush(heap, entry)
            if heap[0] is entry:
                heapq.heappush(self.parked_tops if take in self.parked else self.tops, (key, take))

    def cheapest(self, rank: int) -> tuple[int, int, list[_Vm]] | None:
        """The least disruptive reclaim a demand of pool rank ``rank`` may make, or None."""
        key = self.legal_top()
        if key is None or -key[0] <= rank:
            return None  # every legal reclaim touches a pool ranked at or above the demand
        node, block = key[4], key[6]
        return node, block, self.victims[node][block]

    def legal_top(self) -> tuple | None:
        """The key of the cheapest reclaim that breaks no floor, parking takes that would."""
        tops = self.tops
        while tops:
            key, take = tops[0]
            if take in self.parked:
                heapq.heappop(tops)
                continue
            current = self._top(take)
            if current is None:
                heapq.heappop(tops)
            elif current != key:
                heapq.heapreplace(tops, (current, take))
            else:
                breach = self.planner.breach(take)
                if breach is None:
                    return key
                heapq.heappop(tops)
                self.parked[take] = breach
                heapq.heappush(self.parked_tops, (key, take))
                self.planner.note_parked(self, take, breach)
        return None

    def unpark(self, take: tuple) -> None:
        if self.parked.pop(take, None) is not None:
            current = self._top(take)
            if current is not None:
                heapq.heappush(self.tops, (current, take))

    def floor_stop(self, rank: int) -> tuple | None:
        """The floor that stops the cheapest reclaim a demand of ``rank`` could otherwise make."""
        key = self._parked_top()
        if key is None or -key[0] <= rank:
            return None
        return self.parked[self.parked_tops[0][1]]

    def nearest_nodes(self, bound: tuple | None, rank: int, limit: int) -> list[int]:
        """Up to ``limit`` nodes holding the cheapest reclaims a demand of pool rank ``rank``
        may make, cheapest first, none whose cost exceeds ``bound`` (read only: a best-first
        walk of the heaps that leaves them as they are)."""
        version = self.planner.version
        tops = self.tops
        frontier: list[tuple] = []
        sequence = itertools.count()
        if tops:
            frontier.append((tops[0][0], next(sequence), None, 0))
        takes: set[tuple] = set()
        nodes: list[int] = []
        seen: set[int] = set()
        while frontier and len(nodes) < limit:
            key, _, take, index = heapq.heappop(frontier)
            if -key[0] <= rank or (bound is not None and key[:4] > bound):
                break
            if take is None:
                for child in (2 * index + 1, 2 * index + 2):
                    if child < len(tops):
                        heapq.heappush(frontier, (tops[child][0], next(sequence), None, child))
                take = tops[index][1]
                if take in takes or take in self.parked:
                    continue
                takes.add(take)
                if self.heaps[take]:
                    heapq.heappush(frontier, (self.heaps[take][0][0], next(sequence), take, 0))
                continue
            heap = self.heaps[take]
            for child in (2 * index + 1, 2 * index + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child][0], next(sequence), take, child))
            node = key[4]
            if heap[index][1] == version[node] and node not in seen:
                seen.add(node)
                nodes.append(node)
        return nodes

    def cheapest_any(self) -> tuple | None:
        """The key of the cheapest reclaim of all, floors or not (to name the pool in the way)."""
        keys = [key for key in (self.legal_top(), self._parked_top()) if key is not None]
        return min(keys) if keys else None

    def _parked_top(self) -> tuple | None:
        """The key of the cheapest reclaim among parked takes."""
        tops = self.parked_tops
        while tops:
            key, take = tops[0]
            current = self._top(take) if take in self.parked else None
            if current is None:
                heapq.heappop(tops)
            elif current != key:
                heapq.heapreplace(tops, (current, take))
            else:
                return key
        return None

    def _top(self, take: tuple) -> tuple | None:
        heap = self.heaps[take]
        version = self.planner.version
        while heap and heap[0][1] != version[heap[0][0][4]]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None


def _heap_nodes(heaps: list[list], version: list[int], limit: int) -> list[int]:
    """Up to ``limit`` nodes of current entries in the free-partition ``heaps``, best fit
    first, read only: a best-first walk that leaves the heaps as they are."""
    nodes: list[int] = []
    frontier = [(heap[0], position, 0) for position, heap in enumerate(heaps) if heap]
    heapq.heapify(frontier)
    while frontier and len(nodes) < limit:
        entry, position, index = heapq.heappop(frontier)
        if entry[3] == version[entry[1]]:
            nodes.append(entry[1])
        heap = heaps[position]
        for child in (2 * index + 1, 2 * index + 2):
            if child < len(heap):
                heapq.heappush(frontier, (heap[child], position, child))
    return nodes


def _count_by_size(demands: list[Demand]) -> dict[int, int]:
    """How many of the demands want each size, sizes in increasing order."""
    counts: dict[int, int] = {}
    for size in sorted(demand.gpus for demand in demands):
        counts[size] = counts.get(size, 0) + 1
    return counts


def _with_mates(victims: list[_Vm]) -> list[_Vm]:
    """The victims of a reclaim: the VMs holding its partition's GPUs, plus every running
    member of their jobs, wherever they run (a running job is reclaimed whole)."""
    if not any(vm.mates for vm in victims):
        return victims
    ids = {vm.id for vm in victims}
    whole = list(victims)
    for vm in victims:
        for mate in vm.mates:
            if mate.id not in ids:
                ids.add(mate.id)
                whole.append(mate)
    return whole


def _job_sizes(victims: list[_Vm]) -> dict[str, tuple[int, int]]:
    """Per job among the victims: how many of its VMs and GPUs the reclaim takes."""
    sizes: dict[str, tuple[int, int]] = {}
    for vm in victims:
        if vm.mates:
            count, gpus = sizes.get(vm.group, (0, 0))
            sizes[vm.group] = (count + 1, gpus + vm.ngpus)
    return sizes


def _reclaim_key(victims: list[_Vm], node: int, block: int) -> tuple[tuple, tuple]:
    """The cost key (see `_Reclaims`) of preempting ``victims`` (sorted by id) to free ``block``
    of ``node``, and their take, in one pass (every node's reclaims are keyed this way)."""
    rank = victims[0].rank
    gpus = started = 0
    taken: dict[int, int] = {}
    replicas: dict[int, int] = {}
    for vm in victims:
        if vm.rank < rank:
            rank = vm.rank
        gpus += vm.ngpus
        started += vm.started
        taken[vm.pool] = taken.get(vm.pool, 0) + vm.ngpus
        if vm.deployment is not None:
            replicas[vm.deployment] = replicas.get(vm.deployment, 0) + 1
    take = tuple(sorted(taken.items()))
    if replicas:
        take += tuple(sorted((-1 - deployment, count) for deployment, count in replicas.items()))
    key = (-rank, gpus, len(victims), -started, node, tuple(map(_ID, victims)), block)
    return key, take


class _Planner:
    def __init__(
        self,
        snapshot: Snapshot,
        *,
        protect: bool = True,
        spared: frozenset[str] = frozenset(),
        memo: PlanMemo | None = None,
    ) -> None:
        """``spared``: ids of running VMs this plan must not preempt (`improve.whole_plan`
        asks how a plan looks without some victims); their GPUs stay busy, like on-demand."""
        self.fabric = snapshot.capacity_set.fabric
        # VMs in their pool's protection window are no victims (rule 3a); off for the what-if
        # that times a wait (protection.explain_waits). A VM no demand outranks is left to
        # rule 3, so that a wait for it is explained by rank.
        self.protected = protection.protected_vms(snapshot) if protect else {}
        if self.protected:
            rank = {pool.name: pool.rank for pool in snapshot.pools}
            best = min((rank[demand.pool] for demand in snapshot.demands), default=None)
            pools = {vm.id: vm.pool for vm in snapshot.vms}
            self.protected = {
                vm: end
                for vm, end in self.protected.items()
                if best is not None and rank[pools[vm]] > best
            }
        self.memo = memo
        self._index_pools(snapshot)
        self._index_nodes(snapshot, memo)
        # What-ifs (no protection, spared VMs) read the memo; the plan itself keeps its VMs.
        self._index_vms(snapshot, spared, memo, keep=protect and not spared)
        self.demands = snapshot.demands
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.unsatisfied: list[Unsatisfied] = []
        self.free_heaps: dict[int, list] = {}
        # Block size (shared nodes) or (size, tenant) (its dedicated nodes) -> reclaims index,
        # built on first need.
        self.reclaims: dict[int | tuple[int, str], _Reclaims] = {}
        self.searches: list[tuple[int, bool]] = []  # (states expanded, cut short) per search
        self._build_free_heaps()
        # Quotas (tenancy.py): None without any. Groups refused for one: their ids.
        self.quota_book = QuotaBook(snapshot) if snapshot.quotas else None
        self.over_quota: list[str] = []
        self._scopes: dict[str | None, list[int]] = {}  # tenant -> the ready nodes it may use
        self._enter_scope(None)
        self._begin()

    # -- indexes ---------------------------------------------------------------------------

    def _index_pools(self, snapshot: Snapshot) -> None:
        pools = sorted(snapshot.pools, key=lambda pool: pool.rank)
        self.pools = pools
        self.pool_index = {pool.name: index for index, pool in enumerate(pools)}
        self.pool_by_rank = {pool.rank: pool for pool in pools}
        self.held = [0] * len(pools)
        self.floors = [pool.floor_gpus for pool in pools]
        deployments = snapshot.deployments
        self.deployments = deployments
        self.deployment_index = {d.name: index for index, d in enumerate(deployments)}
        self.replicas = [0] * len(deployments)
        self.min_replicas = [d.min_replicas for d in deployments]

    def _index_nodes(self, snapshot: Snapshot, memo: PlanMemo | None) -> None:
        seen = memo.nodes if memo is not None else None
        if seen is not None and seen[0] is snapshot.nodes and seen[1] == self.fabric:
            # The same frozen nodes: the same indexes (none is changed by planning; the
            # tables' own caches of best fits hold for any plan).
            for name, value in seen[2].items():
                setattr(self, name, value)
        else:
            self._index_node_tables(snapshot)
            if memo is not None:
                derived = {name: getattr(self, name) for name in _NODE_INDEXES}
                memo.nodes = (snapshot.nodes, self.fabric, derived)
        count = len(self.node_names)
        self.version = [0] * count
        self.placed = [0] * count
        self.busy = list(self.failed)
        # GPUs no reclaim can free: failed, on-demand, under notice, or placed by this plan.
        self.fixed = list(self.failed)
        self.notified = [0] * count
        self.protected_gpus = [0] * count
        self.pinned_gpus = [0] * count  # members of jobs that cannot be reclaimed whole
        self.foreign_gpus = [0] * count  # other tenants' VMs on a dedicated node
        self.node_vms: list[list[_Vm]] = [[] for _ in range(count)]

    def _index_node_tables(self, snapshot: Snapshot) -> None:
        """What the nodes alone decide (`_NODE_INDEXES`)."""
        nodes = sorted(snapshot.nodes, key=lambda node: node.name)
        self.node_names = [node.name for node in nodes]
        self.node_position = {node.name: index for index, node in enumerate(nodes)}
        tables: dict[tuple, _Table] = {}
        self.tables: list[_Table] = []
        self.ready = [node.state == "ready" for node in nodes]
        self.ready_nodes = [index for index, ready in enumerate(self.ready) if ready]
        # Dedicated nodes: per node the tenant it serves alone (None: shared).
        self.node_tenant = [node.tenant for node in nodes]
        self.dedicated = sorted({tenant for tenant in self.node_tenant if tenant is not None})
        self.failed = [gpu_mask(node.failed_gpus) for node in nodes]
        for node in nodes:
            blocks = partition_table(node, self.fabric)
            table = tables.get(blocks)
            if table is None:
                table = tables[blocks] = _Table(blocks)
            self.tables.append(table)

    def _index_vms(
        self, snapshot: Snapshot, spared: frozenset[str], memo: PlanMemo | None, *, keep: bool
    ) -> None:
        pool_index, node_position = self.pool_index, self.node_position
        busy, fixed, held, node_vms = self.busy, self.fixed, self.held, self.node_vms
        ranks = [pool.rank for pool in self.pools]
        on_demand = [pool.kind == "on_demand" for pool in self.pools]
        protected = self.protected
        node_tenant = self.node_tenant
        masks: dict[tuple[int, ...], int] = {}  # fleets repeat a few GPU sets many times
        reused = memo.vms if memo is not None else {}
        kept: dict[int, tuple[Vm, tuple, _Vm]] = {}
        for vm in snapshot.vms:
            pool = pool_index[vm.pool]
            node = node_position[vm.node]
            mask = masks.get(vm.gpus)
            if mask is None:
                mask = masks[vm.gpus] = gpu_mask(vm.gpus)
            busy[node] |= mask
            if vm.state == "notified":
                self.notified[node] |= mask
                fixed[node] |= mask
                continue
            held[pool] += len(vm.gpus)
            deployment = None
            if vm.deployment is not None:
                deployment = self.deployment_index[vm.deployment]
                self.replicas[deployment] += 1
            if on_demand[pool] or vm.id in spared:
                fixed[node] |= mask  # rule 1: never preempted (or spared: see __init__)
                continue
            if vm.id in protected:
                fixed[node] |= mask  # rule 3a: fresh work is no victim
                self.protected_gpus[node] |= mask
                continue
            owner = node_tenant[node]
            if owner is not None and vm.tenant != owner:
                fixed[node] |= mask  # another tenant's VM on a dedicated node: left alone
                self.foreign_gpus[node] |= mask
                continue
            if memo is None or vm.group is not None:
                node_vms[node].append(_Vm(vm, pool, ranks[pool], deployment, node, mask))
                continue
            # A VM of no job is never changed once built (`_index_jobs` sets only members'
            # mates): the last plan's is reused when built from the same VM, indexes and rank.
            built = (pool, ranks[pool], deployment, node, mask)
            last = reused.get(id(vm))
            if last is not None and last[0] is vm and last[1] == built:
                item = last[2]
            else:
                item = _Vm(vm, *built)
            kept[id(vm)] = (vm, built, item)
            node_vms[node].append(item)
        if memo is not None and keep:
            memo.vms = kept
        self._index_jobs(snapshot)
        self.held_before = list(self.held)
        self.busy_before = list(self.busy)

    def _index_jobs(self, snapshot: Snapshot) -> None:
        """Running jobs (VMs sharing a group) are reclaimed whole: each member learns its
        mates. A job with a running member no reclaim may take (on-demand, or any other VM
        indexing left out of ``node_vms``) keeps every member: they become fixed too."""
        # Nodes that run a member of a job reclaimed whole (members only ever leave).
        self.job_nodes: set[int] = set()
        if all(vm.group is None for vm in snapshot.vms):
            return
        jobs: dict[str, list[_Vm]] = {}
        for vms in self.node_vms:
            for member in vms:
                if member.group is not None:
                    jobs.setdefault(member.group, []).append(member)
        running: dict[str, int] = {}
        for vm in snapshot.vms:
            if vm.group is not None and vm.state != "notified":
                running[vm.group] = running.get(vm.group, 0) + 1
        node_tenant = self.node_tenant
        for group, members in jobs.items():
            if len(members) < running[group] or (
                # members on a tenant's dedicated nodes and elsewhere: no demand may take all
                self.dedicated and len({node_tenant[member.node] for member in members}) > 1
            ):
                for member in members:
                    self.node_vms[member.node].remove(member)
                    self.fixed[member.node] |= member.mask
                    self.pinned_gpus[member.node] |= member.mask
            elif len(members) > 1:
                for member in members:
                    member.mates = tuple(mate for mate in members if mate is not member)
                    self.job_nodes.add(member.node)

    def _build_free_heaps(self) -> None:
        """Per block size, a heap of each ready node's best-fit free partition: one set of
        heaps for the shared nodes (``free_heaps``), one per tenant for its dedicated nodes
        (``tenant_heaps``); ``node_heaps`` names each node's."""
        self.free_heaps = {}
        self.tenant_heaps: dict[str, dict[int, list]] = {tenant: {} for tenant in self.dedicated}
        self.node_heaps = [
            self.free_heaps if tenant is None else self.tenant_heaps[tenant]
            for tenant in self.node_tenant
        ]
        for node, table in enumerate(self.tables):
            if not self.ready[node]:
                continue
            heaps = self.node_heaps[node]
            for size, key, block in table.free_fits(self.busy[node], self.fixed[node]):
                heaps.setdefault(size, []).append((key, node, block, 0))
        for heaps in (self.free_heaps, *self.tenant_heaps.values()):
            for heap in heaps.values():
                heapq.heapify(heap)

    def _reclaims_of(self, size: int, tenant: str | None = None) -> _Reclaims:
        """The reclaims of this size on the shared nodes, or on ``tenant``'s dedicated ones."""
        key = size if tenant is None else (size, tenant)
        reclaims = self.reclaims.get(key)
        if reclaims is None:
            reclaims = self.reclaims[key] = _Reclaims(self, size, tenant)
        return reclaims

    def _scoped_reclaims(self, size: int) -> list[_Reclaims]:
        """The reclaims the group being served may make: on shared nodes, and on its tenant's
        dedicated nodes if it has any."""
        if self._own_heaps is None:
            return [self._reclaims_of(size)]
        return [self._reclaims_of(size), self._reclaims_of(size, self._tenant)]

    def _enter_scope(self, tenant: str | None) -> None:
        """Serve the next group as ``tenant``'s: the nodes it may use are the shared ones and
        those dedicated to it (`_own_heaps` is None when it has none)."""
        self._tenant = tenant
        self._own_heaps = self.tenant_heaps.get(tenant) if tenant is not None else None
        if not self.dedicated:
            self._scope_nodes = self.ready_nodes
            return
        nodes = self._scopes.get(tenant)
        if nodes is None:
            node_tenant = self.node_tenant
            nodes = self._scopes[tenant] = [
                node for node in self.ready_nodes if node_tenant[node] in (None, tenant)
            ]
        self._scope_nodes = nodes

    def blocker(self, node: int, mask: int) -> int:
        """Why a partition can be neither given nor reclaimed (an explain category)."""
        if mask & self.failed[node]:
            return explain.FAILED
        if mask & self.placed[node]:
            return explain.PLANNED
        if mask & self.notified[node]:
            return explain.NOTIFIED
        protected, pinned = self.protected_gpus[node], self.pinned_gpus[node]
        if mask & protected and not mask & self.fixed[node] & ~protected:
            return explain.PROTECTED  # and by nothing else (on-demand outlasts protection)
        if mask & pinned and not mask & self.fixed[node] & ~(pinned | protected):
            return explain.PINNED  # spot members of jobs a VM elsewhere keeps whole
        foreign = self.foreign_gpus[node]
        if mask & foreign and not mask & self.fixed[node] & ~(foreign | pinned | protected):
            return explain.FOREIGN  # other tenants' VMs on a dedicated node
        return explain.ON_DEMAND

    def _refresh(self, node: int, indexed: dict[int, tuple] | None = None) -> None:
        """A node changed: drop its old heap entries (by version) and index it again, or, for a
        node put back as it was, restore its reclaims from ``indexed`` (`_save`)."""
        self.version[node] += 1
        if not self.ready[node]:
            return
        version = self.version[node]
        heaps = self.node_heaps[node]
        for size, key, block in self.tables[node].free_fits(self.busy[node], self.fixed[node]):
            heapq.heappush(heaps.setdefault(size, []), (key, node, block, version))
        tenant = self.node_tenant[node]
        for size, reclaims in self.reclaims.items():
            if reclaims.tenant != tenant:
                continue  # indexes another scope's nodes
            if indexed is not None and size in indexed:
                reclaims.restore(node, indexed[size])
            else:
                reclaims.index(node)

    # -- the plan --------------------------------------------------------------------------

    def run(self, order: list[str] | None = None) -> Plan:
        """The plan, serving groups in rule 8's order, or in ``order`` (group ids) if given."""
        groups: dict[str, list[Demand]] = {}
        for demand in self.demands:
            groups.setdefault(demand.group, []).append(demand)
        pool_rank = {pool.name: pool.rank for pool in self.pools}
        self.order = order or sorted(
            groups,
            key=lambda group: (
                min(pool_rank[d.pool] for d in groups[group]),
                min(d.requested_at for d in groups[group]),
                group,
            ),
        )
        tenancy = self.quota_book is not None or bool(self.dedicated)
        for group in self.order:
            demands = groups[group]
            demands.sort(key=lambda d: (-d.gpus, d.requested_at, d.id))
            if tenancy:
                self._serve_as_tenant(group, demands)
            else:
                self._serve(group, demands)
        self._prefer_disks()
        if self.memo is not None:
            # Each reclaims index points back at this planner: a caller planning again (with a
            # memo) has the planner freed by reference counting now, not left to the cyclic
            # collector to find among everything it holds (simulation/engine.py). A one-shot
            # plan keeps it: the CLI ends without freeing anything.
            self.reclaims.clear()
        return self._result()

    def _serve_as_tenant(self, group: str, demands: list[Demand]) -> None:
        """Serve a group within its tenant's quotas, on the nodes its tenant may use."""
        tenant = demands[0].tenant  # a group's demands share one (validation)
        book = self.quota_book
        if book is not None:
            refusal = book.refusal(tenant, demands)
            if refusal is not None:
                self.over_quota.append(group)
                for demand in demands:
                    self.unsatisfied.append(
                        Unsatisfied(demand=demand.id, group=group, reason=refusal)
                    )
                return
        self._enter_scope(tenant)
        placed = len(self.placements)
        self._serve(group, demands)
        self._enter_scope(None)
        if book is not None and len(self.placements) > placed:
            book.add(tenant, demands)

    def _prefer_disks(self) -> None:
        """Move placements on free capacity to the node that holds their demand's disk
        (``disk_node``: a reclaimed spot VM waiting to resume), where it has a partition of the
        same size that the finished plan leaves free, was free before the plan (no victim's
        GPUs) and fits at least as well as the placement's own (best-fit key, judged on the
        finished plan). The VM then resumes on its own disk instead of a fresh one.

        It runs after every group is served, so it is a preference below every rule: who is
        served, who is preempted, and every pool's balance are exactly the plan's; only where
        a VM that preempts nobody lands changes, and the free capacity left is packed as well."""
        disks = {d.id: d.disk_node for d in self.demands if d.disk_node is not None}
        tenants = {d.id: d.tenant for d in self.demands} if self.dedicated else {}
        for position, placement in enumerate(self.placements):
            disk = self.node_position.get(disks.get(placement.demand, ""))
            if disk is None or placement.preempts or not self.ready[disk]:
                continue
            owner = self.node_tenant[disk]
            if owner is not None and owner != tenants[placement.demand]:
                continue  # dedicated to another tenant
            node = self.node_position[placement.node]
            if node == disk:
                continue
            table = self.tables[node]
            block = table.blocks.index(placement.gpus)
            mask = table.masks[block]
            busy, fixed = self.busy[node] & ~mask, self.fixed[node] & ~mask
            target = self._disk_block(disk, len(placement.gpus), table.fit_key(busy, fixed, block))
            if target is None:
                continue
            self.busy[node], self.fixed[node] = busy, fixed
            self.placed[node] &= ~mask
            disk_table = self.tables[disk]
            taken = disk_table.masks[target]
            self.busy[disk] |= taken
            self.fixed[disk] |= taken
            self.placed[disk] |= taken
            self.placements[position] = Placement(
                demand=placement.demand, node=self.node_names[disk], gpus=disk_table.blocks[target]
            )

    def _disk_block(self, disk: int, size: int, fit: tuple[int, ...]) -> int | None:
        """The best-fitting partition of ``size`` on node ``disk`` that is free now and was free
        before the plan, if it fits at least as well as ``fit``."""
        table = self.tables[disk]
        unusable = self.busy[disk] | self.busy_before[disk]
        keys = [
            (table.fit_key(self.busy[disk], self.fixed[disk], block), block)
            for block in table.by_size.get(size, ())
            if not table.masks[block] & unusable
        ]
        if not keys:
            return None
        key, block = min(keys)
        return block if key <= fit else None

    def _serve(self, group: str, demands: list[Demand]) -> None:
        if all(self._place_free(demand) for demand in demands):
            self._commit()
            return
        self._rollback()
        if len(demands) == 1:
            failure = self._place_with_reclaims(demands)
            if failure is None:
                self._commit()
                return
            self._rollback()
        else:
            wanted, free, outside_free = self._free_for(demands)
            # With a size that has no free partition at all, every placement has victims and
            # costs at least the cheapest single reclaim (see _least_victims).
            least = None if all(free.values()) else self._least_victims(demands, outside_free)
            order, cost, nodes, failure = self._least_disruptive_order(demands, least)
            if order is not None and cost == least:
                self._commit()  # as cheap as any placement can be: kept as it was made
                return
            steps = self._search(demands, cost, nodes, wanted, free, outside_free, least)
            if steps is not None:
                self._place_steps(steps)
                self._commit()
                return
            if order is not None:
                self._place_with_reclaims(order)  # deterministic: as when it was chosen
                self._commit()
                return
        failed, reason = failure
        self._give_up(group, demands, failed, reason)

    def _least_disruptive_order(self, demands: list[Demand], least: tuple | None) -> tuple:
        """Try the group's orders with reclaims (state rolled back after each). Return the
        least disruptive order that places the whole group, its cost and the nodes it uses
        (or None, None, ()), and the first failure. An order that costs ``least``, a lower
        bound on every placement's cost, cannot be bettered: it ends the trials and stays
        placed (not rolled back)."""
        best = None
        failure = None
        compared = 0
        for order in self._orders(demands):
            attempt = self._place_with_reclaims(order)
            if attempt is None:
                cost = self._attempt_cost()
                if cost == least:
                    return order, cost, tuple(sorted(self._saved)), None
                if best is None or cost < best[0]:
                    best = (cost, order, tuple(sorted(self._saved)))
            self._rollback()
            if attempt is None:
                compared += 1
                if compared == _MAX_ORDERS_COMPARED:
                    break
            elif failure is None:
                failure = attempt
                if not self._placeable_alone(attempt[0]):
                    break  # no order can help a demand that fits nowhere even on its own
        if best is None:
            return None, None, (), failure
        cost, order, nodes = best
        return order, cost, nodes, failure

    def _free_for(self, demands: list[Demand]) -> tuple[dict, dict, list[int]]:
        """How many demands of each size the group has; per size, the nodes with a free
        partition of that size (see `_free_nodes_by_size`); and, on a large set, the sizes
        with more free partitions than the group could use (its reclaims of those sizes
        break rule 6, so `_search` leaves them out)."""
        whole = len(self.ready_nodes) <= _WHOLE_SET_NODES
        wanted = _count_by_size(demands)
        free = self._free_nodes_by_size(wanted)
        outside_free = [
            size for size, nodes in free.items() if not whole and len(nodes) > wanted[size] + 1
        ]
        return wanted, free, outside_free

    def _search(
        self,
        demands: list[Demand],
        bound: tuple | None,
        used: tuple[int, ...],
        wanted: dict[int, int],
        free: dict[int, list[int]],
        outside_free: list[int],
        least: tuple | None,
    ) -> list[tuple[Demand, int, int]] | None:
        """The exact least disruptive placement of the group (search.py), if it is strictly
        better than ``bound`` (the key of the planner's own placement, which used the nodes
        ``used``), as (demand, node, block) steps in order.

        Small sets are searched whole. On a large set the search looks at a region around
        the planner's placement (see `_region`) and gives up ties: it looks only for a placement
        of strictly smaller cost, since two victim sets there practically never weigh the same
        to the microsecond."""
        whole = len(self.ready_nodes) <= _WHOLE_SET_NODES
        if bound is not None and least is not None and not whole and bound[0] == least[0]:
            return None  # no placement costs less (`least`), and on a large set ties are kept
        region = self._scope_nodes if whole else self._region(demands, bound, used, free, wanted)
        kinds = [(demand.gpus, self._demand_rank(demand)) for demand in demands]
        search = GroupSearch(
            nodes=[
                (node, self.tables[node], self.fixed[node], self.node_vms[node]) for node in region
            ],
            kinds=kinds,
            held=self.held,
            floors=self.floors,
            replicas=self.replicas,
            min_replicas=self.min_replicas,
            outside_free=outside_free,
            budget=_SEARCH_BUDGET if whole else _REGION_SEARCH_BUDGET,
            ties=whole,
        )
        steps = search.run(bound)
        self.searches.append((search.expanded, search.cut_short))
        if steps is None:
            return None
        waiting: dict[tuple[int, int], list[Demand]] = {}
        for demand, kind in zip(demands, kinds, strict=True):
            waiting.setdefault(kind, []).append(demand)
        for queue in waiting.values():
            queue.reverse()
        return [(waiting[search.kinds[kind]].pop(), node, block) for kind, node, block in steps]

    def _least_victims(self, demands: list[Demand], outside_free: list[int]) -> tuple | None:
        """A lower bound on the key of any placement of the group that preempts someone: the
        key of the cheapest legal reclaim of a size that may need one (None if none may).

        Every such placement takes at least one partition that held VMs, all of which it
        preempts, so its cost is at least that partition's; when it is equal, that partition's
        VMs are all its victims, and its key is that reclaim's."""
        rank = min(self._demand_rank(demand) for demand in demands)
        least = None
        for size in sorted({demand.gpus for demand in demands} - set(outside_free)):
            for reclaims in self._scoped_reclaims(size):
                key = reclaims.legal_top()
                if key is not None and -key[0] > rank:
                    candidate = (key[:4], (key[4],), key[5])
                    if least is None or candidate < least:
                        least = candidate
        return least

    def _free_nodes_by_size(self, wanted: dict[int, int]) -> dict[int, list[int]]:
        """Per size, up to two nodes more than the group has demands of that size (``wanted``)
        that have a free partition of that size, best fit first."""
        return {size: self._free_nodes(size, count + 2) for size, count in wanted.items()}

    def _region(
        self,
        demands: list[Demand],
        bound: tuple | None,
        used: tuple[int, ...],
        free: dict[int, list[int]],
        wanted: dict[int, int],
    ) -> list[int]:
        """The nodes a large set's group search looks at.

        The nodes of the planner's own placement (``used``); per size, one free node more than
        the group has demands of that size (``free``; if a free partition of that size is left
        even then, rule 6 forbids every reclaim of that size, and more free nodes would only
        repeat the same choices); and per size that may need a reclaim, the nodes of the
        cheapest reclaims the group's best-ranked demand may make, none dearer than ``bound``
        (a reclaim dearer than a whole placement cannot be part of a cheaper one)."""
        rank = min(self._demand_rank(demand) for demand in demands)
        nodes = set(used)
        for size, free_nodes in free.items():
            nodes.update(free_nodes[: wanted[size] + 1])
            if len(free_nodes) > wanted[size] + 1:
                continue
            limit = _REGION_RECLAIMS_PER_DEMAND * wanted[size]
            cost = bound[0] if bound is not None else None
            for reclaims in self._scoped_reclaims(size):
                nodes.update(reclaims.nearest_nodes(cost, rank, limit))
        # A reclaim there preempts whole jobs: their members' nodes are part of the outcome.
        for node in list(nodes):
            for vm in self.node_vms[node]:
                nodes.update(mate.node for mate in vm.mates if self.ready[mate.node])
        return sorted(nodes)

    def _free_nodes(self, size: int, limit: int) -> list[int]:
        """Up to ``limit`` nodes with a free partition of this size that the group being served
        may use, best fit first (read only)."""
        heaps = [self.free_heaps.get(size, [])]
        if self._own_heaps is not None:
            heaps.append(self._own_heaps.get(size, []))
        return _heap_nodes(heaps, self.version, limit)

    def _place_steps(self, steps: list[tuple[Demand, int, int]]) -> None:
        for demand, node, block in steps:
            mask = self.tables[node].masks[block]
            victims = _with_mates([vm for vm in self.node_vms[node] if vm.mask & mask])
            self._occupy(node, block, demand, victims)

    def _attempt_cost(self) -> tuple:
        victims = self._victims
        if not victims:
            return ((0, 0, 0, 0), (), ())
        return (
            (
                -min(vm.rank for vm in victims),
                sum(vm.ngpus for vm in victims),
                len(victims),
                -sum(vm.started for vm in victims),
            ),
            tuple(sorted({vm.node for vm in victims})),
            tuple(sorted(vm.id for vm in victims)),
        )

    def _orders(self, demands: list[Demand]) -> Iterator[list[Demand]]:
        """The orders in which a group's demands are tried with reclaims.

        First largest first. Then, for a group mixing pools of different ranks, its
        lowest-ranked demands first: they may reclaim from fewer pools, so they get first pick
        and the higher-ranked demands reclaim what is left. Then, for small groups, every other
        order (demands alike in size and pool count once): one demand's cheapest reclaim can
        take the only partition another demand could use.
        """
        yield demands
        lowest_first = sorted(demands, key=lambda demand: -self._demand_rank(demand))
        if lowest_first != demands:
            yield lowest_first
        if not 2 <= len(demands) <= _MAX_REORDERED_GROUP:
            return
        tried = {self._signature(demands), self._signature(lowest_first)}
        for order in itertools.permutations(demands):
            signature = self._signature(order)
            if signature not in tried:
                tried.add(signature)
                yield list(order)

    def _signature(self, demands: Iterable[Demand]) -> tuple[tuple[int, int], ...]:
        return tuple((demand.gpus, self._demand_rank(demand)) for demand in demands)

    def _placeable_alone(self, demand: Demand) -> bool:
        placed = self._place_free(demand) or self._cheapest_reclaim(demand) is not None
        self._rollback()
        return placed

    def _place_with_reclaims(self, demands: list[Demand]) -> tuple[Demand, str] | None:
        """Place each demand on free capacity, else by its cheapest legal reclaim. On failure
        return the demand that could not be placed and why (the state is left for rollback)."""
        for demand in demands:
            if self._place_free(demand):
                continue
            reclaim = self._cheapest_reclaim(demand)
            if reclaim is None:
                return demand, self._why_unplaced(demand)
            node, block, victims = reclaim
            self._occupy(node, block, demand, victims)
        return None

    def _demand_rank(self, demand: Demand) -> int:
        return self.pools[self.pool_index[demand.pool]].rank

    def _place_free(self, demand: Demand) -> bool:
        """Place the demand on its best-fit free partition; a tenant's dedicated nodes first."""
        own = self._own_heaps
        if own is not None and self._place_free_on(own.get(demand.gpus), demand):
            return True
        return self._place_free_on(self.free_heaps.get(demand.gpus), demand)

    def _place_free_on(self, heap: list | None, demand: Demand) -> bool:
        version = self.version
        while heap:
            _, node, block, entry_version = heap[0]
            if entry_version != version[node]:
                heapq.heappop(heap)
                continue
            self._occupy(node, block, demand, ())
            return True
        return False

    def _cheapest_reclaim(self, demand: Demand) -> tuple[int, int, list[_Vm]] | None:
        if self._own_heaps is None:
            return self._reclaims_of(demand.gpus).cheapest(self._demand_rank(demand))
        # The tenant has dedicated nodes: the cheaper of their reclaims and the shared ones.
        rank = self._demand_rank(demand)
        best = None
        for reclaims in self._scoped_reclaims(demand.gpus):
            key = reclaims.legal_top()
            if key is not None and -key[0] > rank and (best is None or key < best[0]):
                best = (key, reclaims)
        if best is None:
            return None
        key, reclaims = best
        node, block = key[4], key[6]
        return node, block, reclaims.victims[node][block]

    def breach(self, take: tuple) -> tuple | None:
        """The floor a reclaim with this take would break now, or None (rule 2)."""
        for index, amount in take:
            if index >= 0:
                if self.held[index] - amount < self.floors[index]:
                    return ("pool", index)
            elif self.replicas[-1 - index] - amount < self.min_replicas[-1 - index]:
                return ("deployment", -1 - index)
        return None

    def note_parked(self, reclaims: _Reclaims, take: tuple, breach: tuple) -> None:
        """A take was parked for a floor. Only a breach caused by this group's own tentative
        preemptions can be undone by a rollback; any other holds for the rest of the plan,
        since headroom only shrinks."""
        kind, index = breach
        counts = self.held if kind == "pool" else self.replicas
        if any(changed is counts and at == index for changed, at, _ in self._saved_counts):
            self._parked_now.append((reclaims, take))

    def _occupy(self, node: int, block: int, demand: Demand, victims: list[_Vm]) -> None:
        self._save(node)
        table = self.tables[node]
        mask = table.masks[block]
        demand_pool = self.pools[self.pool_index[demand.pool]]
        node_name = self.node_names[node]
        self._victims.extend(victims)
        jobs = _job_sizes(victims)
        elsewhere = sorted({vm.node for vm in victims} - {node})
        for other in elsewhere:
            self._save(other)
        for vm in victims:
            self.node_vms[vm.node].remove(vm)
            self.busy[vm.node] &= ~vm.mask
            self._change(self.held, vm.pool, -vm.ngpus)
            pool = self.pools[vm.pool]
            replicas_after = 0
            if vm.deployment is not None:
                self._change(self.replicas, vm.deployment, -1)
                replicas_after = self.replicas[vm.deployment]
            reason = explain.preemption_reason(
                demand=demand.id,
                demand_pool=demand_pool.name,
                demand_rank=demand_pool.rank,
                pool=pool.name,
                rank=pool.rank,
                floor_gpus=pool.floor_gpus,
                held_before=self.held[vm.pool] + vm.ngpus,
                held_after=self.held[vm.pool],
                deployment=(
                    self.deployments[vm.deployment].name if vm.deployment is not None else None
                ),
                replicas_after=replicas_after,
                min_replicas=(self.min_replicas[vm.deployment] if vm.deployment is not None else 0),
            )
            if vm.mates:
                count, gpus = jobs[vm.group]
                reason += "; " + explain.job_reason(group=vm.group, vms=count, gpus=gpus)
            self.preemptions.append(
                Preemption(
                    vm=vm.id,
                    pool=pool.name,
                    node=self.node_names[vm.node],
                    gpus=vm.gpus,
                    for_demand=demand.id,
                    reason=reason,
                    tenant=vm.tenant,
                )
            )
        self.placed[node] |= mask
        # A victim may have held a failed GPU: freeing the VM does not mend the GPU.
        self.busy[node] |= mask | self.failed[node]
        self.fixed[node] |= mask
        self.placements.append(
            Placement(
                demand=demand.id,
                node=node_name,
                gpus=table.blocks[block],
                preempts=tuple(sorted(vm.id for vm in victims)),
            )
        )
        self._refresh(node)
        for other in elsewhere:
            self.busy[other] |= self.failed[other]
            self._refresh(other)  # its job members left: free GPUs, and new reclaims

    def _save(self, node: int) -> None:
        """Keep what the node holds, and its reclaims, for a rollback of this attempt."""
        if node not in self._saved:
            self._saved[node] = (
                self.busy[node],
                self.placed[node],
                self.fixed[node],
                list(self.node_vms[node]),
                {size: reclaims.state(node) for size, reclaims in self.reclaims.items()},
            )

    def _change(self, counts: list[int], index: int, delta: int) -> None:
        self._saved_counts.append((counts, index, counts[index]))
        counts[index] += delta

    # -- tentative group placement ---------------------------------------------------------

    def _begin(self) -> None:
        self._saved: dict[int, tuple[int, int, int, list[_Vm], dict[int, tuple]]] = {}
        self._saved_counts: list[tuple[list[int], int, int]] = []
        self._parked_now: list[tuple[_Reclaims, tuple]] = []
        self._marks = (len(self.placements), len(self.preemptions))
        self._victims: list[_Vm] = []

    def _commit(self) -> None:
        self._begin()

    def _rollback(self) -> None:
        for node, (busy, placed, fixed, vms, _) in self._saved.items():
            self.busy[node] = busy
            self.placed[node] = placed
            self.fixed[node] = fixed
            self.node_vms[node] = vms
        for counts, index, old in reversed(self._saved_counts):
            counts[index] = old
        placements, preemptions = self._marks
        del self.placements[placements:]
        del self.preemptions[preemptions:]
        for node in sorted(self._saved):
            self._refresh(node, self._saved[node][4])
        # Takes parked for a floor that the attempt's own preemptions broke may be legal again.
        for reclaims, take in self._parked_now:
            reclaims.unpark(take)
        self._begin()

    # -- why a demand waits ----------------------------------------------------------------

    def _why_unplaced(self, demand: Demand) -> str:
        reason = self._why_unplaced_shared(demand)
        if self.dedicated:
            nodes = self._free_elsewhere(demand.gpus)
            if nodes:
                block = explain.block_name(self.fabric, demand.gpus)
                reason += "; " + explain.dedicated_reason(block=block, nodes=nodes)
        return reason

    def _free_elsewhere(self, size: int) -> list[str]:
        """Nodes dedicated to tenants other than the group's that have a free partition of
        this size: capacity the group may not use."""
        version = self.version
        nodes: set[int] = set()
        for tenant, heaps in self.tenant_heaps.items():
            if tenant != self._tenant:
                nodes.update(
                    entry[1] for entry in heaps.get(size, ()) if entry[3] == version[entry[1]]
                )
        return sorted(self.node_names[node] for node in nodes)

    def _why_unplaced_shared(self, demand: Demand) -> str:
        """Why the demand cannot be placed, judged on the nodes it may use (the shared ones
        and its tenant's dedicated ones)."""
        size = demand.gpus
        demand_pool = self.pools[self.pool_index[demand.pool]]
        block = explain.block_name(self.fabric, size)
        scopes = self._scoped_reclaims(size)
        for reclaims in scopes:
            breach = reclaims.floor_stop(demand_pool.rank)
            if breach is not None:
                return self._floor_words(block, breach)
        if demand_pool is self.pools[-1]:
            return explain.lowest_rank_reason(
                block=block, demand_pool=demand_pool.name, demand_rank=demand_pool.rank
            )
        keys = [key for key in (reclaims.cheapest_any() for reclaims in scopes) if key is not None]
        key = min(keys) if keys else None
        if key is not None:
            victim_pool = self.pool_by_rank[-key[0]]
            return explain.rank_reason(
                block=block,
                victim_pool=victim_pool.name,
                victim_rank=victim_pool.rank,
                demand_pool=demand_pool.name,
                demand_rank=demand_pool.rank,
            )
        blocked = [
            sum(counts) for counts in zip(*(reclaims.blocked for reclaims in scopes), strict=True)
        ]
        if sum(blocked) == 0:
            unready = sum(reclaims.unready for reclaims in scopes)
            return explain.no_block_reason(block=block, unready_nodes=unready)
        return explain.blocked_reason(block=block, counts=blocked)

    def _floor_words(self, block: str, breach: tuple) -> str:
        kind, index = breach
        if kind == "pool":
            pool = self.pools[index]
            return explain.floor_reason(
                block=block, pool=pool.name, floor_gpus=pool.floor_gpus, held=self.held[index]
            )
        return explain.min_replicas_reason(
            block=block,
            deployment=self.deployments[index].name,
            min_replicas=self.min_replicas[index],
            replicas=self.replicas[index],
        )

    def _give_up(self, group: str, demands: list[Demand], failed: Demand, reason: str) -> None:
        for demand in demands:
            if demand is failed or len(demands) == 1:
                words = reason
            else:
                words = explain.group_reason(
                    group=group, demand=failed.id, gpus=failed.gpus, reason=reason
                )
            self.unsatisfied.append(Unsatisfied(demand=demand.id, group=group, reason=words))

    def _result(self) -> Plan:
        placed = [0] * len(self.pools)
        demand_pool = {demand.id: self.pool_index[demand.pool] for demand in self.demands}
        for placement in self.placements:
            placed[demand_pool[placement.demand]] += len(placement.gpus)
        balances = tuple(
            PoolBalance(
                name=pool.name,
                rank=pool.rank,
                before_gpus=self.held_before[index],
                after_gpus=self.held[index] + placed[index],
                floor_gpus=pool.floor_gpus,
            )
            for index, pool in enumerate(self.pools)
        )
        return Plan(
            complete=not self.unsatisfied,
            placements=tuple(self.placements),
            preemptions=tuple(self.preemptions),
            unsatisfied=tuple(self.unsatisfied),
            pools=balances,
        )


class _HeldPlanner(_Planner):
    """The planner of a reservation pass (`plan`'s ``held``): the VMs held inside reservations
    are spared, and a partition only they (with pinned, protected or foreign VMs) keep from a
    demand is worded as held (`explain.HELD`), not as on-demand. A class of its own, so that a
    plan without held VMs runs none of this."""

    def __init__(self, snapshot: Snapshot, *, held: frozenset[str]) -> None:
        self._held = held
        super().__init__(snapshot, spared=held)

    def _index_vms(
        self, snapshot: Snapshot, spared: frozenset[str], memo: PlanMemo | None, *, keep: bool
    ) -> None:
        super()._index_vms(snapshot, spared, memo, keep=keep)
        self.held_gpus = [0] * len(self.node_names)
        on_demand = {pool.name for pool in self.pools if pool.kind == "on_demand"}
        for vm in snapshot.vms:
            if vm.id in self._held and vm.state == "running" and vm.pool not in on_demand:
                self.held_gpus[self.node_position[vm.node]] |= gpu_mask(vm.gpus)

    def blocker(self, node: int, mask: int) -> int:
        category = super().blocker(node, mask)
        held = self.held_gpus[node]
        if category == explain.ON_DEMAND and mask & held:
            others = (
                held | self.pinned_gpus[node] | self.protected_gpus[node] | self.foreign_gpus[node]
            )
            if not mask & self.fixed[node] & ~others:
                return explain.HELD  # by no on-demand VM (which would outlast the reservation)
        return category
