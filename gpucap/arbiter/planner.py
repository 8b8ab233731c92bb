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
   disruptive legal reclaim. One demand's reclaim can take the partition another needed, so a
   group of several demands is tried in several orders (largest first; its lowest-ranked
   demands first, as they may reclaim from fewer pools; then, for groups of up to four, the
   other orders) and placed in the least disruptive order that works, comparing up to six.
   A group no order places is reported unsatisfied with the reason of the first attempt.
2. A reclaim takes one whole partition of the node's table (rule 5); its victims are forced:
   every VM holding a GPU of that partition. It is legal when no victim is on-demand (rule 1),
   under notice, or of a pool ranked at or above the demand's pool (rule 3), when it leaves
   every pool at or above its floor and every deployment at or above its ``min_replicas``,
   counting all earlier preemptions of the plan (rule 2), and when the partition has no failed
   GPU and no GPU given earlier in the plan. GPUs a victim frees outside the partition become
   free capacity for the rest of the plan.
3. Least disruption (rule 7) is `disruption_cost`, compared as a tuple, smaller first:

       (-(rank of the highest-priority pool among the victims),
        preempted GPUs, preempted VMs, -(sum of the victims' start times))

   that is: the most important pool touched is as unimportant as possible; then fewest GPUs;
   then fewest VMs; then the most recently started VMs (with equal VM counts, the largest sum
   of start times is the least running time lost, whatever ``now`` is). Ties go to the node
   name, then the sorted victim ids, then the partition's place in the table. Among all legal
   (node, partition) pairs the planner takes the true minimum of this order.

Indexes keep this fast on fleets of thousands of nodes. Per block size there is a heap of each
node's best-fit free partition, and (built the first time a demand of that size needs a reclaim)
an index of reclaims keyed by the cost above (`_Reclaims`). A node's entries are recomputed only
when that node changes; stale entries carry an old node version and are dropped when they
surface. Rank legality needs no separate index: the first element of the cost is minus the
highest-priority victim rank, so when the cheapest legal reclaim touches a pool ranked at or
above the demand, no legal reclaim of that size exists. Floors are global, so reclaims are
grouped by what they take from each pool and deployment: one check decides a whole group, and a
group that would break a floor is parked (for the rest of the plan, or until the rollback of the
attempt that used up the headroom). The cheapest legal reclaim is thus found in O(log n) even
when floors bind everywhere, and it is still the true minimum.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta

from gpucap.arbiter import explain
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
from gpucap.arbiter.topology import gpu_mask, partition_table

__all__ = ["disruption_cost", "plan"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# Where each block size counts in a best-fit key: breaking a free 8 weighs most.
_FIT_SLOT = {8: 0, 4: 1, 2: 2, 1: 3}
# Groups up to this size that fail in the usual orders are retried in every order.
_MAX_REORDERED_GROUP = 4
# A group placed with reclaims is placed in the least disruptive of up to this many orders.
_MAX_ORDERS_COMPARED = 6


def plan(snapshot: Snapshot) -> Plan:
    """Plan one capacity set. ``snapshot`` must pass `validation.snapshot_problems`."""
    return _Planner(snapshot).run()


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
            broken = [0] * 8
            for other in self.overlaps[index]:
                if is_free[other]:
                    broken[_FIT_SLOT[self.sizes[other]]] += 1
                elif not masks[other] & fixed:
                    broken[4 + _FIT_SLOT[self.sizes[other]]] += 1
            key = (tuple(broken), index)
            size = self.sizes[index]
            if size not in best or key < best[size]:
                best[size] = key
        return tuple((size, key, index) for size, (key, index) in sorted(best.items()))


class _Vm:
    """A running VM as the planner sees it."""

    __slots__ = (
        "deployment",
        "gpus",
        "id",
        "mask",
        "ngpus",
        "node",
        "pool",
        "rank",
        "started",
        "take",
        "tenant",
    )

    def __init__(self, vm: Vm, pool: int, rank: int, deployment: int | None, node: int) -> None:
        self.id = vm.id
        self.pool = pool
        self.rank = rank
        self.deployment = deployment
        self.node = node
        self.gpus = tuple(sorted(vm.gpus))
        self.mask = gpu_mask(vm.gpus)
        self.ngpus = len(vm.gpus)
        self.started = _microseconds(vm.started_at)
        self.tenant = vm.tenant
        # What preempting this VM alone takes (see _Reclaims).
        self.take = ((pool, self.ngpus),)
        if deployment is not None:
            self.take += ((-1 - deployment, 1),)


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

    def __init__(self, planner: _Planner, size: int) -> None:
        self.planner = planner
        self.size = size
        count = len(planner.node_names)
        self.heaps: dict[tuple, list] = {}
        self.tops: list[tuple[tuple, tuple]] = []
        self.parked: dict[tuple, tuple] = {}  # take -> the floor it would break
        self.parked_tops: list[tuple[tuple, tuple]] = []  # like tops, for parked takes
        self.victims: list[dict[int, list[_Vm]]] = [{} for _ in range(count)]
        self.node_blocked: list[tuple[int, ...]] = [(0, 0, 0, 0)] * count
        self.blocked = [0, 0, 0, 0]  # ready partitions no reclaim can free, by explain category
        self.unready = 0  # nodes not ready that have partitions of this size
        for node, table in enumerate(planner.tables):
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
        version = planner.version[node]
        blocked = [0, 0, 0, 0]
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
            if len(victims) == 1:
                vm = victims[0]
                key = (-vm.rank, vm.ngpus, 1, -vm.started, node, (vm.id,), block)
                take = vm.take
            else:
                victims.sort(key=lambda vm: vm.id)
                key = (
                    -min(vm.rank for vm in victims),
                    sum(vm.ngpus for vm in victims),
                    len(victims),
                    -sum(vm.started for vm in victims),
                    node,
                    tuple(vm.id for vm in victims),
                    block,
                )
                take = _combined_take(victims)
            victims_at[block] = victims
            if take not in cheapest or key < cheapest[take]:
                cheapest[take] = key
        self.victims[node] = victims_at
        old = self.node_blocked[node]
        for category in range(4):
            self.blocked[category] += blocked[category] - old[category]
        self.node_blocked[node] = tuple(blocked)
        for take, key in cheapest.items():
            heap = self.heaps.setdefault(take, [])
            entry = (key, version)
            if initial:
                heap.append(entry)
                continue
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


def _combined_take(victims: list[_Vm]) -> tuple:
    gpus: dict[int, int] = {}
    replicas: dict[int, int] = {}
    for vm in victims:
        gpus[vm.pool] = gpus.get(vm.pool, 0) + vm.ngpus
        if vm.deployment is not None:
            replicas[vm.deployment] = replicas.get(vm.deployment, 0) + 1
    return tuple(sorted(gpus.items())) + tuple(
        sorted((-1 - deployment, count) for deployment, count in replicas.items())
    )


class _Planner:
    def __init__(self, snapshot: Snapshot) -> None:
        self.fabric = snapshot.capacity_set.fabric
        self._index_pools(snapshot)
        self._index_nodes(snapshot)
        self._index_vms(snapshot)
        self.demands = snapshot.demands
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.unsatisfied: list[Unsatisfied] = []
        self.free_heaps: dict[int, list] = {}
        self.reclaims: dict[int, _Reclaims] = {}  # block size -> index, built on first need
        self._build_free_heaps()
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

    def _index_nodes(self, snapshot: Snapshot) -> None:
        nodes = sorted(snapshot.nodes, key=lambda node: node.name)
        self.node_names = [node.name for node in nodes]
        self.node_position = {node.name: index for index, node in enumerate(nodes)}
        tables: dict[tuple, _Table] = {}
        self.tables: list[_Table] = []
        self.ready = [node.state == "ready" for node in nodes]
        self.failed = [gpu_mask(node.failed_gpus) for node in nodes]
        for node in nodes:
            blocks = partition_table(node, self.fabric)
            table = tables.get(blocks)
            if table is None:
                table = tables[blocks] = _Table(blocks)
            self.tables.append(table)
        count = len(nodes)
        self.version = [0] * count
        self.placed = [0] * count
        self.busy = list(self.failed)
        # GPUs no reclaim can free: failed, on-demand, under notice, or placed by this plan.
        self.fixed = list(self.failed)
        self.notified = [0] * count
        self.node_vms: list[list[_Vm]] = [[] for _ in range(count)]

    def _index_vms(self, snapshot: Snapshot) -> None:
        pools = self.pools
        for vm in snapshot.vms:
            pool = self.pool_index[vm.pool]
            node = self.node_position[vm.node]
            mask = gpu_mask(vm.gpus)
            self.busy[node] |= mask
            if vm.state == "notified":
                self.notified[node] |= mask
                self.fixed[node] |= mask
                continue
            self.held[pool] += len(vm.gpus)
            deployment = None
            if vm.deployment is not None:
                deployment = self.deployment_index[vm.deployment]
                self.replicas[deployment] += 1
            if pools[pool].kind == "on_demand":
                self.fixed[node] |= mask  # rule 1: never preempted
                continue
            self.node_vms[node].append(_Vm(vm, pool, pools[pool].rank, deployment, node))
        self.held_before = list(self.held)

    def _build_free_heaps(self) -> None:
        heaps: dict[int, list] = {}
        for node, table in enumerate(self.tables):
            if not self.ready[node]:
                continue
            for size, key, block in table.free_fits(self.busy[node], self.fixed[node]):
                heaps.setdefault(size, []).append((key, node, block, 0))
        for heap in heaps.values():
            heapq.heapify(heap)
        self.free_heaps = heaps

    def _reclaims_of(self, size: int) -> _Reclaims:
        reclaims = self.reclaims.get(size)
        if reclaims is None:
            reclaims = self.reclaims[size] = _Reclaims(self, size)
        return reclaims

    def blocker(self, node: int, mask: int) -> int:
        """Why a partition can be neither given nor reclaimed (an explain category)."""
        if mask & self.failed[node]:
            return explain.FAILED
        if mask & self.placed[node]:
            return explain.PLANNED
        if mask & self.notified[node]:
            return explain.NOTIFIED
        return explain.ON_DEMAND

    def _refresh(self, node: int) -> None:
        """A node changed: drop its old heap entries (by version) and index it again."""
        self.version[node] += 1
        if not self.ready[node]:
            return
        version = self.version[node]
        for size, key, block in self.tables[node].free_fits(self.busy[node], self.fixed[node]):
            heapq.heappush(self.free_heaps.setdefault(size, []), (key, node, block, version))
        for reclaims in self.reclaims.values():
            reclaims.index(node)

    # -- the plan --------------------------------------------------------------------------

    def run(self) -> Plan:
        groups: dict[str, list[Demand]] = {}
        for demand in self.demands:
            groups.setdefault(demand.group, []).append(demand)
        pool_rank = {pool.name: pool.rank for pool in self.pools}
        order = sorted(
            groups.items(),
            key=lambda item: (
                min(pool_rank[d.pool] for d in item[1]),
                min(d.requested_at for d in item[1]),
                item[0],
            ),
        )
        for group, demands in order:
            demands.sort(key=lambda d: (-d.gpus, d.requested_at, d.id))
            self._serve(group, demands)
        return self._result()

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
            order, failure = self._least_disruptive_order(demands)
            if order is not None:
                self._place_with_reclaims(order)  # deterministic: as when it was chosen
                self._commit()
                return
        failed, reason = failure
        self._give_up(group, demands, failed, reason)

    def _least_disruptive_order(
        self, demands: list[Demand]
    ) -> tuple[list[Demand] | None, tuple[Demand, str] | None]:
        """Try the group's orders with reclaims (state rolled back after each). Return the
        least disruptive order that places the whole group, or None and the first failure."""
        best = None
        failure = None
        compared = 0
        for order in self._orders(demands):
            attempt = self._place_with_reclaims(order)
            cost = self._attempt_cost() if attempt is None else None
            self._rollback()
            if attempt is None:
                if best is None or cost < best[0]:
                    best = (cost, order)
                compared += 1
                if compared == _MAX_ORDERS_COMPARED:
                    break
            elif failure is None:
                failure = attempt
                if not self._placeable_alone(attempt[0]):
                    break  # no order can help a demand that fits nowhere even on its own
        return (best[1] if best else None), failure

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
        heap = self.free_heaps.get(demand.gpus)
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
        return self._reclaims_of(demand.gpus).cheapest(self._demand_rank(demand))

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
        if node not in self._saved:
            self._saved[node] = (
                self.busy[node],
                self.placed[node],
                self.fixed[node],
                list(self.node_vms[node]),
            )
        table = self.tables[node]
        mask = table.masks[block]
        demand_pool = self.pools[self.pool_index[demand.pool]]
        node_name = self.node_names[node]
        self._victims.extend(victims)
        for vm in victims:
            self.node_vms[node].remove(vm)
            self.busy[node] &= ~vm.mask
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
            self.preemptions.append(
                Preemption(
                    vm=vm.id,
                    pool=pool.name,
                    node=node_name,
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

    def _change(self, counts: list[int], index: int, delta: int) -> None:
        self._saved_counts.append((counts, index, counts[index]))
        counts[index] += delta

    # -- tentative group placement ---------------------------------------------------------

    def _begin(self) -> None:
        self._saved: dict[int, tuple[int, int, int, list[_Vm]]] = {}
        self._saved_counts: list[tuple[list[int], int, int]] = []
        self._parked_now: list[tuple[_Reclaims, tuple]] = []
        self._marks = (len(self.placements), len(self.preemptions))
        self._victims: list[_Vm] = []

    def _commit(self) -> None:
        self._begin()

    def _rollback(self) -> None:
        for node, (busy, placed, fixed, vms) in self._saved.items():
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
            self._refresh(node)
        # Takes parked for a floor that the attempt's own preemptions broke may be legal again.
        for reclaims, take in self._parked_now:
            reclaims.unpark(take)
        self._begin()

    # -- why a demand waits ----------------------------------------------------------------

    def _why_unplaced(self, demand: Demand) -> str:
        size = demand.gpus
        demand_pool = self.pools[self.pool_index[demand.pool]]
        block = explain.block_name(self.fabric, size)
        reclaims = self._reclaims_of(size)
        breach = reclaims.floor_stop(demand_pool.rank)
        if breach is not None:
            return self._floor_words(block, breach)
        if demand_pool is self.pools[-1]:
            return explain.lowest_rank_reason(
                block=block, demand_pool=demand_pool.name, demand_rank=demand_pool.rank
            )
        key = reclaims.cheapest_any()
        if key is not None:
            victim_pool = self.pool_by_rank[-key[0]]
            return explain.rank_reason(
                block=block,
                victim_pool=victim_pool.name,
                victim_rank=victim_pool.rank,
                demand_pool=demand_pool.name,
                demand_rank=demand_pool.rank,
            )
        if sum(reclaims.blocked) == 0:
            return explain.no_block_reason(block=block, unready_nodes=reclaims.unready)
        return explain.blocked_reason(block=block, counts=reclaims.blocked)

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
