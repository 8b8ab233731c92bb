"""The least disruptive placement of one demand group: an exact branch-and-bound search.

The planner's first try (planner.py) places a group's demands one at a time, each on free
capacity or on its own cheapest reclaim, in a few orders. That can miss the cheapest placement
of the whole group when one demand's choice changes another's: a reclaim that frees GPUs
another demand can use, floor headroom that only one of two reclaims can have, a partition that
two demands both want. `GroupSearch` finds the true minimum.

What it searches
----------------
A group placement is a sequence of steps, one per demand, in any order. A step gives a demand
one partition of its size on a ready node, disjoint from the partitions earlier steps took:

- a free step takes a partition whose GPUs are all free (free at the start, or freed by a VM an
  earlier step preempted);
- a reclaim step takes a partition some running VMs still hold and preempts them. It is legal
  only when no partition of its size is free at that moment (rule 6), when every VM it preempts
  may be preempted by this demand (rules 1 and 3: not on-demand, not under notice, of a pool
  ranked strictly below the demand's), and when every pool and deployment stays at or above its
  floor, counting the group's earlier steps (rule 2).

A reclaim step's victims include every running member of their jobs (VMs sharing a group),
wherever they run: their GPUs are freed too, and their nodes count as touched. A job's weight
is shared out over partitions by the part of the whole job's GPUs inside, so the lower bound
below still never counts a victim twice, and a VM is "wholly inside" a partition only when
its whole job is.

A placement's disruption is `planner.disruption_cost` of all its victims (rule 7), ties broken
by the victims' sorted nodes, then their sorted ids. That is exactly what the referee in
tests/arbiter/rules.py accepts, so any step order the search picks is a valid plan.

How
---
The first component of the cost, ``x``, is minus the rank of the most important pool touched,
so the search runs in levels: for each ``x`` from the least important pool upwards, it looks
for placements whose victims all come from pools ranked ``-x`` or below, and stops at the first
level where one exists. Within a level the rest of the cost is the sum, over victims, of
``(GPUs, 1, -start time)``: plain additive weights. The levels start with one that allows no
victim at all (a placement on free capacity that the planner's best-fit free pass missed).

Within a level it is a depth-first branch and bound over steps: which demand next (demands
alike in size and rank are one kind), then which partition, cheapest first. The initial bound
is the planner's own placement of the group, so the search returns only a strictly better one.
What keeps it small:

- A state is what the steps took (and the last step, see below); a state reached a second time
  is not expanded again.
- Lower bound: the weight so far, plus for the demands left one partition each (distinct
  partitions, per size) weighted by the victims' GPUs it overlaps: a victim spread over several
  partitions is shared out by the fraction of its GPUs in each, so it is never counted twice.
  A demand counts only partitions it could use: every VM lying wholly inside must be one it
  may preempt, since no other step's partition can reach that VM. A state is dropped when the
  bound already exceeds the best placement found, when a demand left has no partition at all,
  or when the GPUs the rest must take exceed the headroom above the floors of the pools the
  level may take from.
- One order per outcome: two adjacent steps that could be swapped with the same result are
  taken only in the preferred order (reclaims before free steps, then by kind, node and
  partition). The least step order of any placement, in that preference, never has such a
  pair, so no placement is lost.
- Free partitions that overlap exactly the same other partitions (two cards of a PCIe node,
  two single GPUs of one NVLink pair) are twins: taking either leaves the same choices, so only
  the first is offered. Free partitions are offered best fit first, as the planner places free
  capacity, so that equally good placements leave the most to later groups.

Budget: the search counts expanded states and stops at ``budget``. It then keeps the best
placement found so far, or the planner's, so a huge group on a huge set costs a bounded amount
of work and falls back to the planner's placement. The planner's budget and the state counts
measured on small sets are in planner.py; tests/arbiter/test_least_disruption.py checks that
no search on the sizes compared with exhaustive search is cut short, so there the result is
the proven minimum.

The search sees the nodes of a region that the planner picks: on small sets every ready node;
on large sets the nodes of its own placement, enough free nodes per size, and the nodes of the
cheapest reclaims (see planner.py). ``outside_free`` names the sizes that still have free
partitions outside the region, so rule 6 is judged on the whole set. With ``ties`` off (large
sets) the search looks only for a strictly smaller weight and leaves equal weights to the
planner's placement: two different victim sets there practically never weigh the same to the
microsecond.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpucap.arbiter.topology import FIT_SLOT

__all__ = ["GroupSearch", "Step"]

# Victim weights are scaled so that a victim's weight can be shared out over the partitions it
# overlaps in whole numbers (a VM holds 1, 2, 4 or 8 GPUs).
_SHARES = 8
_ZERO = (0, 0, 0)
_NO_RANK = 1 << 30  # ranked below every pool

# One step of a placement: (index of the demand's kind in `GroupSearch.kinds`, node, block),
# with the node as the planner's node index and the block as its index in the node's table.
Step = tuple[int, int, int]


class _Out(Exception):
    """The search reached its budget."""


class _Block:
    """One partition of a region node that some demand of the group could take."""

    __slots__ = (
        "full",
        "index",
        "inside",
        "inside_rank",
        "mask",
        "occupants",
        "rank",
        "shared",
        "shares",
        "size",
        "twin",
        "x",
    )

    def __init__(self, index: int, table, occupants: tuple[int, ...], search: GroupSearch):
        self.index = index
        self.mask = mask = table.masks[index]
        self.size = table.sizes[index]
        # Free blocks that overlap the same other blocks are interchangeable.
        self.twin = table.overlaps[index]
        # Positions in GroupSearch.vms: the VMs holding the block's GPUs, then the other
        # running members of their jobs (reclaimed with them), wherever they run.
        direct = occupants
        occupants = search.with_mates(occupants)
        self.occupants = occupants
        # GPUs of each job (a lone VM is a job of one) lying inside the block.
        job_inside: dict[int, int] = {}
        for p in direct:
            job = search.job[p]
            job_inside[job] = job_inside.get(job, 0) + (search.vms[p].mask & mask).bit_count()
        # The rank of the most important pool among the occupants: a demand may reclaim the
        # block only if ranked above it.
        rank = _NO_RANK
        # The same among the occupants lying wholly inside: only the demand taking the block
        # can preempt those, as no other step's block can reach them.
        inside_rank = _NO_RANK
        # The occupants' weights, whole and shared out by the part of their GPUs inside.
        full = shared = _ZERO
        shares = []
        inside_vms = []
        for p in occupants:
            vm = search.vms[p]
            rank = min(rank, vm.rank)
            # A job's weight is shared out by the part of the whole job's GPUs inside, so
            # disjoint blocks never count one victim twice.
            job = search.job[p]
            inside, total = job_inside.get(job, 0), search.job_gpus[job]
            if inside == total:
                inside_rank = min(inside_rank, vm.rank)
                inside_vms.append(p)
            weight = search.weights[p]
            full = _add(full, weight)
            share = weight if inside == total else _scale(weight, inside, total)
            shared = _add(shared, share)
            shares.append((p, share))
        self.inside = frozenset(inside_vms)
        self.rank = rank
        self.inside_rank = inside_rank
        self.x = -rank if occupants else None
        self.full = full
        self.shared = shared
        self.shares = tuple(shares)


def _scale(weight: tuple[int, int, int], inside: int, ngpus: int) -> tuple[int, int, int]:
    return (
        weight[0] * inside // ngpus,
        weight[1] * inside // ngpus,
        weight[2] * inside // ngpus,
    )


def _add(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


class GroupSearch:
    """Branch and bound over the placements of one group (see the module docs).

    ``nodes``: the region, as (planner node index, partition table, fixed GPUs mask, preemptible
    VMs) in node order; a fixed GPU is one no step may take (failed, on-demand, under notice,
    given earlier in the plan). ``kinds``: the group's demands as (GPUs, pool rank), one entry
    per demand. ``held``/``floors`` per pool and ``replicas``/``min_replicas`` per deployment
    are the counts before the group.
    """

    def __init__(
        self,
        *,
        nodes: Sequence[tuple[int, object, int, Sequence]],
        kinds: Sequence[tuple[int, int]],
        held: Sequence[int],
        floors: Sequence[int],
        replicas: Sequence[int],
        min_replicas: Sequence[int],
        outside_free: Iterable[int],
        budget: int,
        ties: bool = True,
    ) -> None:
        distinct = sorted(set(kinds), key=lambda kind: (-kind[0], kind[1]))
        self.kinds = distinct
        self.counts = [sum(1 for kind in kinds if kind == d) for d in distinct]
        self.left = len(kinds)
        self.sizes = sorted({size for size, _ in distinct}, reverse=True)
        self.best_rank = min(rank for _, rank in distinct)
        self.held = list(held)
        self.floors = floors
        self.replicas = list(replicas)
        self.min_replicas = min_replicas
        self.outside_free = frozenset(outside_free)
        self.budget = budget
        self.ties = ties
        self.expanded = 0
        self.cut_short = False

        self.node_ids = [node for node, _, _, _ in nodes]
        self.tables = [table for _, table, _, _ in nodes]
        self.fixed = [fixed for _, _, fixed, _ in nodes]
        self.node_vms: list[range] = []
        self.vms: list = []
        for _, _, _, vms in nodes:
            self.vms.extend(vms)
        self._index_jobs(len(nodes))
        self.vm_rank = [vm.rank for vm in self.vms]
        self.weights = [(_SHARES * vm.ngpus, _SHARES, -_SHARES * vm.started) for vm in self.vms]
        # blocks[region node][size]: the partitions of that size no fixed GPU or unpreemptable
        # VM keeps from every demand of the group.
        self.blocks: list[dict[int, list[_Block]]] = []
        position = 0
        for _, table, fixed, vms in nodes:
            first = position
            position += len(vms)
            for p in range(first, position):
                self.vm_node[p] = len(self.node_vms)
            self.node_vms.append(range(first, position))
            # GPUs of VMs that no demand of the group may preempt keep their blocks, too.
            kept = fixed
            for vm in vms:
                if vm.rank <= self.best_rank:
                    kept |= vm.mask
            masks = [(first + k, vm.mask) for k, vm in enumerate(vms)]
            by_size: dict[int, list[_Block]] = {}
            for size in self.sizes:
                usable = []
                for index in table.by_size.get(size, ()):
                    mask = table.masks[index]
                    if not mask & kept:
                        occupants = tuple(p for p, vm_mask in masks if vm_mask & mask)
                        block = _Block(index, table, occupants, self)
                        if block.rank > self.best_rank:  # no job member kept elsewhere
                            usable.append(block)
                by_size[size] = usable
            self.blocks.append(by_size)
        # Nodes with a partition of each size free from the start.
        self.free_at_start = {
            size: [
                r
                for r, by_size in enumerate(self.blocks)
                if any(not block.occupants for block in by_size[size])
            ]
            for size in self.sizes
        }
        # Per size, the free partitions of each node as an untouched node offers them (one of
        # each set of twins), with their best-fit key: (fit, region node, block).
        self.taken = [0] * len(self.blocks)  # nothing taken yet, for _fit
        self.preempted = [False] * len(self.vms)
        self.free_lists: dict[int, list[tuple]] = {}
        for size in self.sizes:
            offered = []
            for r in self.free_at_start[size]:
                twins = set()
                for block in self.blocks[r][size]:
                    if not block.occupants and block.twin not in twins:
                        twins.add(block.twin)
                        offered.append((self._fit(r, block), r, block))
            self.free_lists[size] = offered

    def _index_jobs(self, region_nodes: int) -> None:
        """Running jobs: members outside the region join ``vms`` (after the region's VMs, on
        no region node); ``job[p]`` numbers each VM's job, ``mates[p]`` lists the others."""
        position = {vm.id: p for p, vm in enumerate(self.vms)}
        self.region_vms = len(self.vms)
        for p in range(self.region_vms):
            for mate in self.vms[p].mates:
                if mate.id not in position:
                    position[mate.id] = len(self.vms)
                    self.vms.append(mate)
        self.job = list(range(len(self.vms)))
        self.mates: list[tuple[int, ...]] = [()] * len(self.vms)
        for p, vm in enumerate(self.vms):
            if vm.mates:
                members = sorted([p, *(position[mate.id] for mate in vm.mates)])
                self.job[p] = members[0]
                self.mates[p] = tuple(q for q in members if q != p)
        self.job_gpus = [0] * len(self.vms)
        for p, vm in enumerate(self.vms):
            self.job_gpus[self.job[p]] += vm.ngpus
        # The region node of each VM (-1 outside the region), filled in by the caller's loop.
        self.vm_node = [-1] * len(self.vms)
        self.touch = [0] * region_nodes

    def with_mates(self, occupants: tuple[int, ...]) -> tuple[int, ...]:
        if not any(self.mates[p] for p in occupants):
            return occupants
        whole = set(occupants)
        for p in occupants:
            whole.update(self.mates[p])
        return tuple(sorted(whole))

    # -- the levels --------------------------------------------------------------------------

    def run(self, bound: tuple | None) -> list[Step] | None:
        """The least disruptive placement strictly better than ``bound`` (a key as
        `placement_key` gives, or None), as steps in order; None if there is none or the budget
        ran out before one was found."""
        levels = sorted({-rank for rank in self.vm_rank if rank > self.best_rank})
        bound_x = bound[0][0] if bound is not None else None
        for x in [None, *levels]:
            if bound_x is not None and x is not None and x > bound_x:
                break
            at_bound = bound is not None and x == bound_x
            self.best_key = bound if at_bound else None
            self.best_weight = tuple(_SHARES * part for part in bound[0][1:]) if at_bound else None
            self.best_steps: list[Step] | None = None
            self._start_level(x)
            try:
                self._expand()
            except _Out:
                self.cut_short = True
                return self.best_steps
            if self.best_steps is not None:
                return self.best_steps
        return None

    def _start_level(self, x: int | None) -> None:
        self.x = x
        count = len(self.blocks)
        self.taken = [0] * count
        # Region nodes some step took a block of or preempted a job member on, in step order.
        self.touched: list[int] = []
        self.is_touched = [False] * count
        self.touch = [0] * count  # steps that touched each region node
        self.preempted = [False] * len(self.vms)
        self.victims: list[int] = []
        self.weight = _ZERO
        self.steps: list[Step] = []
        self.seen: set[tuple] = set()
        # The pools this level may take GPUs from.
        self.victim_pools = sorted(
            {
                vm.pool
                for vm in self.vms
                if x is not None and vm.rank > self.best_rank and -vm.rank <= x
            }
        )
        # Per size, every usable block of an untouched node, cheapest first: by its shared-out
        # weight (for the lower bound) and, for blocks with victims, by its full weight.
        self.bound_lists: dict[int, list[tuple]] = {}
        self.reclaim_lists: dict[int, list[tuple]] = {}
        for size in self.sizes:
            shared, whole = [], []
            for r, by_size in enumerate(self.blocks):
                for block in by_size[size]:
                    if self._allowed(block):
                        shared.append((block.shared, r, block.index, block))
                        if block.occupants:
                            whole.append((block.full, r, block.index, block))
            shared.sort(key=_order)
            whole.sort(key=_order)
            self.bound_lists[size] = shared
            self.reclaim_lists[size] = whole

    def _allowed(self, block: _Block) -> bool:
        """May this level preempt the block's VMs at all?"""
        return block.x is None or (self.x is not None and block.x <= self.x)

    # -- branch and bound --------------------------------------------------------------------

    def _expand(self, last: tuple | None = None) -> None:
        """Expand the current state. ``last`` describes the step that led here (None at the
        start): whether it was free, its sort key, the sizes that had a free partition just
        before it, and for a reclaim its node, block and victims."""
        self.expanded += 1
        if self.expanded > self.budget:
            raise _Out
        if self.left == 0:
            self._consider()
            return
        state = (
            tuple(self.counts),
            tuple(sorted((r, self.taken[r]) for r in self.touched)),
            last,
        )
        if state in self.seen:
            return
        self.seen.add(state)
        if not self._hopeful():
            return
        free_now = frozenset(size for size in self.sizes if self._free_exists(size))
        for kind, (size, rank) in enumerate(self.kinds):
            if not self.counts[kind]:
                continue
            for weight, r, block, new in self._options(size, rank, size in free_now):
                if self.best_weight is not None and _add(self.weight, weight) > self.best_weight:
                    break
                if new and not self._floors_hold(new):
                    continue
                order = (kind, r, block.index)
                if last is not None and self._swapped_order_searched(last, order, r, block, new):
                    continue
                following = (not new, order, free_now, new and (r, block, new))
                self._take(kind, r, block, new, weight)
                self._expand(following)
                self._untake(kind, r, block, new, weight)

    def _swapped_order_searched(
        self, last: tuple, order: tuple, r: int, block: _Block, new: tuple
    ) -> bool:
        """True when this step, taken right after ``last``, could have been taken just before
        it instead, with the same outcome, in an order the search prefers (reclaims before
        free steps, then by sort key). The search takes only the preferred order of every such
        pair, so it drops no outcome: the least step order of any placement, compared as
        (free step, sort key) pairs, never has such a pair."""
        last_free, last_order, free_before, last_reclaim = last
        if not new:
            return last_free and order < last_order
        if last_free:
            # Legal before the free step too, unless that step took the last free partition
            # of this size.
            return block.size not in free_before
        if order > last_order or block.size in free_before:
            return False
        last_r, last_block, last_victims = last_reclaim
        if any(p in last_victims for p in block.occupants):
            return False  # the last reclaim freed part of this block
        if any(self.vm_node[p] != r for p in new):
            return False  # it frees GPUs of job members on other nodes too
        # The last reclaim must stay legal after this one: no free partition of its size.
        return not self._frees(r, block, new, last_r, last_block, last_victims)

    def _frees(
        self, r: int, block: _Block, new: tuple, last_r: int, last_block: _Block, last_victims
    ) -> bool:
        """Would this reclaim, taken before the last one, leave a partition of the last one's
        size free on its node?"""
        taken = self.taken[r] & ~(last_block.mask if last_r == r else 0)
        for other in self.blocks[r][last_block.size]:
            if other.mask & (taken | block.mask):
                continue
            if all(
                (self.preempted[p] and p not in last_victims) or p in new for p in other.occupants
            ):
                return True
        return False

    def _consider(self) -> None:
        key = self.placement_key()
        if self.best_key is None or key < self.best_key:
            self.best_key = key
            self.best_weight = tuple(_SHARES * part for part in key[0][1:])
            self.best_steps = list(self.steps)

    def placement_key(self) -> tuple:
        """Rule 7 for the victims so far, as the planner compares placements."""
        vms = [self.vms[p] for p in self.victims]
        if not vms:
            return ((0, 0, 0, 0), (), ())
        return (
            (
                -min(vm.rank for vm in vms),
                sum(vm.ngpus for vm in vms),
                len(vms),
                -sum(vm.started for vm in vms),
            ),
            tuple(sorted({vm.node for vm in vms})),
            tuple(sorted(vm.id for vm in vms)),
        )

    def _hopeful(self) -> bool:
        """False when the demands left cannot all be placed, or cannot be placed cheaply enough
        to beat the best placement found (see the module docs for the bound)."""
        rest = _ZERO
        for size in self.sizes:
            kinds = [
                (rank, count)
                for (kind_size, rank), count in zip(self.kinds, self.counts, strict=True)
                if kind_size == size and count
            ]
            if not kinds:
                continue
            least = self._least_weight(size, kinds)
            if least is None:
                return False
            rest = _add(rest, least)
        # Floors: the GPUs the rest must take (at least their shares) fit the pools' headroom.
        headroom = sum(max(0, self.held[pool] - self.floors[pool]) for pool in self.victim_pools)
        if rest[0] > _SHARES * headroom:
            return False
        if self.best_weight is None:
            return True
        total = _add(self.weight, rest)
        if total != self.best_weight or not self.ties:
            return total < self.best_weight
        # Only a tie is left. If the rest may add no victim, every completion that adds one
        # weighs more, and the others keep today's victims: hopeful only if they are better.
        return rest != _ZERO or self.placement_key() < self.best_key

    def _least_weight(self, size: int, kinds: list[tuple[int, int]]) -> tuple | None:
        """A lower bound on the shared-out weight of the partitions the demands left of this
        size will take (None if they cannot all get one). ``kinds``: (rank, count) of those
        demands, best rank first.

        A demand can use a partition only if it may preempt every live VM lying wholly inside
        it (no other step's partition can reach such a VM). The bound is the larger of two:
        the cheapest partitions, one per demand, that the best-ranked of them could use; and
        per rank, the cheapest partitions its demands could use."""
        loosest = kinds[0][0]
        wanted = sum(count for _, count in kinds)
        candidates = []  # (shared-out weight, rank of the best-ranked VM wholly inside)
        for r in self.touched:
            taken = self.taken[r]
            for block in self.blocks[r][size]:
                if block.mask & taken or not self._allowed(block):
                    continue
                weight = _ZERO
                inside = _NO_RANK
                for p, share in block.shares:
                    if not self.preempted[p]:
                        weight = _add(weight, share)
                        if p in block.inside:
                            inside = min(inside, self.vm_rank[p])
                if loosest < inside:
                    candidates.append((weight, inside))
        missing = dict(kinds)
        missing_any = wanted
        for weight, r, _, block in self.bound_lists[size]:
            inside = block.inside_rank
            if self.is_touched[r] or inside <= loosest:
                continue
            candidates.append((weight, inside))
            missing_any -= 1
            done = missing_any <= 0
            for rank in missing:
                if rank < inside:
                    missing[rank] -= 1
                done = done and missing[rank] <= 0
            if done:
                break
        candidates.sort()
        if len(candidates) < wanted:
            return None
        best = _ZERO
        for weight, _ in candidates[:wanted]:
            best = _add(best, weight)
        by_rank = _ZERO
        for rank, count in kinds:
            usable = [weight for weight, inside in candidates if rank < inside][:count]
            if len(usable) < count:
                return None
            for weight in usable:
                by_rank = _add(by_rank, weight)
        return max(best, by_rank)

    def _options(self, size: int, rank: int, free_now: bool) -> list[tuple]:
        """The steps a demand of this size and rank may take now, floors aside (the caller
        checks them), cheapest first, as (added weight, region node, block, victims it adds).
        Of free partitions that are twins (they overlap the same other partitions, e.g. two
        cards of a PCIe node) only the first is offered: taking either leaves the same
        choices."""
        options = []
        for r in self.touched:
            taken = self.taken[r]
            twins = set()
            for block in self.blocks[r][size]:
                if block.mask & taken:
                    continue
                new = tuple(p for p in block.occupants if not self.preempted[p])
                if not new:
                    if block.twin not in twins:
                        twins.add(block.twin)
                        options.append((_ZERO, self._fit(r, block), r, block, new))
                    continue
                if free_now or not self._may_preempt(new, rank):
                    continue  # floors are checked when the step is taken
                weight = _ZERO
                for p in new:
                    weight = _add(weight, self.weights[p])
                options.append((weight, (), r, block, new))
        if free_now:
            for fit, r, block in self.free_lists[size]:
                if not self.is_touched[r]:
                    options.append((_ZERO, fit, r, block, ()))
        else:
            for weight, r, _, block in self.reclaim_lists[size]:
                if self.best_weight is not None and _add(self.weight, weight) > self.best_weight:
                    break
                if not self.is_touched[r] and block.rank > rank:
                    options.append((weight, (), r, block, block.occupants))
        options.sort(key=lambda option: (option[0], option[1], option[2], option[3].index))
        return [(weight, r, block, new) for weight, _, r, block, new in options]

    def _fit(self, r: int, block: _Block) -> tuple[int, ...]:
        """Best fit, as the planner places free capacity, so that equally good placements
        leave the most to later groups: the free partitions taking this one breaks, largest
        first, then the partitions a reclaim could still free."""
        table = self.tables[r]
        blocked = self.fixed[r] | self.taken[r]
        busy = blocked
        for p in self.node_vms[r]:
            if not self.preempted[p]:
                busy |= self.vms[p].mask
        broken = [0] * 8
        for other in table.overlaps[block.index]:
            mask = table.masks[other]
            slot = FIT_SLOT[table.sizes[other]]
            if not mask & busy:
                broken[slot] += 1
            elif not mask & blocked:
                broken[4 + slot] += 1
        return tuple(broken)

    def _free_exists(self, size: int) -> bool:
        """Is a partition of this size free right now, anywhere in the set?"""
        if size in self.outside_free:
            return True
        for r in self.touched:
            taken = self.taken[r]
            for block in self.blocks[r][size]:
                if not block.mask & taken and all(self.preempted[p] for p in block.occupants):
                    return True
        return any(not self.is_touched[r] for r in self.free_at_start[size])

    def _may_preempt(self, new: tuple[int, ...], rank: int) -> bool:
        """May a demand of this rank preempt these VMs at this level (floors aside)?"""
        x = self.x
        return all(self.vm_rank[p] > rank and x is not None and -self.vm_rank[p] <= x for p in new)

    def _floors_hold(self, new: tuple[int, ...]) -> bool:
        if len(new) == 1:
            vm = self.vms[new[0]]
            if self.held[vm.pool] - vm.ngpus < self.floors[vm.pool]:
                return False
            deployment = vm.deployment
            return deployment is None or (
                self.replicas[deployment] - 1 >= self.min_replicas[deployment]
            )
        gpus: dict[int, int] = {}
        replicas: dict[int, int] = {}
        for p in new:
            vm = self.vms[p]
            gpus[vm.pool] = gpus.get(vm.pool, 0) + vm.ngpus
            if vm.deployment is not None:
                replicas[vm.deployment] = replicas.get(vm.deployment, 0) + 1
        return all(
            self.held[pool] - amount >= self.floors[pool] for pool, amount in gpus.items()
        ) and all(
            self.replicas[d] - amount >= self.min_replicas[d] for d, amount in replicas.items()
        )

    def _touched_by(self, r: int, new: tuple) -> list[int]:
        """The region nodes a step touches: its own, and those of the job members it frees."""
        nodes = [r]
        for p in new:
            other = self.vm_node[p]
            if other >= 0 and other not in nodes:
                nodes.append(other)
        return nodes

    def _take(self, kind: int, r: int, block: _Block, new: tuple, weight: tuple) -> None:
        for node in self._touched_by(r, new):
            self.touch[node] += 1
            if self.touch[node] == 1:
                self.touched.append(node)
                self.is_touched[node] = True
        self.taken[r] |= block.mask
        for p in new:
            vm = self.vms[p]
            self.preempted[p] = True
            self.held[vm.pool] -= vm.ngpus
            if vm.deployment is not None:
                self.replicas[vm.deployment] -= 1
        self.victims.extend(new)
        self.weight = _add(self.weight, weight)
        self.counts[kind] -= 1
        self.left -= 1
        self.steps.append((kind, self.node_ids[r], block.index))

    def _untake(self, kind: int, r: int, block: _Block, new: tuple, weight: tuple) -> None:
        self.steps.pop()
        self.left += 1
        self.counts[kind] += 1
        self.weight = (
            self.weight[0] - weight[0],
            self.weight[1] - weight[1],
            self.weight[2] - weight[2],
        )
        if new:
            del self.victims[-len(new) :]
        for p in new:
            vm = self.vms[p]
            self.preempted[p] = False
            self.held[vm.pool] += vm.ngpus
            if vm.deployment is not None:
                self.replicas[vm.deployment] += 1
        self.taken[r] &= ~block.mask
        for node in self._touched_by(r, new):
            self.touch[node] -= 1
            if not self.touch[node]:
                self.touched.remove(node)
                self.is_touched[node] = False


def _order(item: tuple) -> tuple:
    weight, r, index, _ = item
    return (weight, r, index)
