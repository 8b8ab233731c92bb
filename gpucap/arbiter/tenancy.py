"""Tenant allocation in the pure core: dedicated nodes and quotas (issue 19).

A node with a ``tenant`` is dedicated to that tenant: the planner (planner.py) indexes its free
partitions and reclaims apart from the shared ones, and only that tenant's demands look at them.
A quota caps the GPUs a tenant holds in one pool or in the whole set; `QuotaBook` keeps the count
while a plan is made and words the refusal. `tenancy_problems` checks the snapshot's fields.

What a tenant holds in a quota's scope: the GPUs of its running and notified VMs (a notified VM
holds its GPUs until its deadline, so a plan's own preemptions never lower the count) plus the
GPUs the plan has placed for its demands so far. The count only grows during a plan, so a group
is checked once, before it is placed: it is refused whole when its GPUs in the scope would take
the tenant past the quota.
"""

from __future__ import annotations

from gpucap.arbiter import explain
from gpucap.arbiter.model import Demand, Node, Quota, Reservation, Snapshot
from gpucap.arbiter.topology import block_sizes

__all__ = ["QuotaBook", "reservation_problems", "tenancy_problems"]

Labelled = list[tuple[str, object]]


def tenancy_problems(
    *,
    nodes: Labelled,
    demands: Labelled,
    quotas: Labelled,
    pool_names: set[str],
    unreadable_pools: set[str],
) -> list[str]:
    """Every problem with the tenant fields: empty names, a group whose demands name different
    tenants, and quotas with an unknown pool, a negative size or a twin."""
    problems: list[str] = []
    for label, node in nodes:
        assert isinstance(node, Node)
        if node.tenant == "":
            problems.append(f"{label}: tenant must not be empty (null: a shared node)")
    group_tenant: dict[str, tuple[str | None, str]] = {}
    for label, demand in demands:
        assert isinstance(demand, Demand)
        if demand.tenant == "":
            problems.append(f"{label}: tenant must not be empty (null: no tenant)")
        first = group_tenant.setdefault(demand.group, (demand.tenant, demand.id))
        if first[0] != demand.tenant:
            problems.append(
                f"{label}: tenant {demand.tenant} differs from tenant {first[0]} of demand "
                f"{first[1]}; the demands of group {demand.group} must share one tenant"
            )
    seen: set[tuple[str, str | None]] = set()
    for label, quota in quotas:
        assert isinstance(quota, Quota)
        if not quota.tenant:
            problems.append(f"{label}: tenant must not be empty")
        if (
            quota.pool is not None
            and quota.pool not in pool_names
            and quota.pool not in unreadable_pools
        ):
            problems.append(f"{label}: pool {quota.pool} is not a pool of the snapshot")
        if quota.max_gpus < 0:
            problems.append(f"{label}: max_gpus must be 0 or more, got {quota.max_gpus}")
        key = (quota.tenant, quota.pool)
        if key in seen:
            problems.append(
                f"{label}: tenant {quota.tenant}'s {_scope_words(quota, None)} is given twice"
            )
        seen.add(key)
    return problems


def reservation_problems(*, reservations: Labelled, nodes: Labelled, fabric: str) -> list[str]:
    """Every problem with the reservations: empty or repeated ids, a tenant's second
    reservation, a block that is no partition size of the fabric, GPUs that are not a positive
    multiple of the block, and reservations that together do not fit the set's ready shared
    nodes (the first reservation that takes the sum past them is named)."""
    problems: list[str] = []
    room = sum(
        node.gpus
        for _, node in nodes
        if isinstance(node, Node) and node.state == "ready" and node.tenant is None
    )
    ids: set[str] = set()
    tenants: dict[str, str] = {}
    total = 0
    sizes = block_sizes(fabric)
    for label, reservation in reservations:
        assert isinstance(reservation, Reservation)
        if not reservation.id:
            problems.append(f"{label}: id must not be empty")
        elif reservation.id in ids:
            problems.append(f"{label}: id {reservation.id} is used by another reservation")
        ids.add(reservation.id)
        tenant = reservation.tenant
        if not tenant:
            problems.append(f"{label}: tenant must not be empty")
        elif tenant in tenants:
            problems.append(
                f"{label}: tenant {tenant} already has reservation {tenants[tenant]}; a tenant "
                f"has at most one reservation in a set"
            )
        else:
            tenants[tenant] = reservation.id
        block = reservation.block_gpus
        if block not in sizes:
            allowed = ", ".join(map(str, sizes))
            problems.append(
                f"{label}: block_gpus must be a partition size of this {fabric} set ({allowed}), "
                f"got {block}"
            )
        if reservation.gpus < 1:
            problems.append(f"{label}: gpus must be 1 or more, got {reservation.gpus}")
            continue
        if block in sizes and reservation.gpus % block:
            problems.append(
                f"{label}: gpus must be a multiple of block_gpus {block}, got {reservation.gpus}"
            )
        before, total = total, total + reservation.gpus
        if before <= room < total:
            problems.append(
                f"{label}: gpus {reservation.gpus} takes the set's reservations to {total} GPUs, "
                f"more than the {room} GPUs of its ready nodes not dedicated to a tenant"
            )
    return problems


class QuotaBook:
    """What each tenant holds in each of its quotas' scopes while a plan is made."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.set_name = snapshot.capacity_set.name
        self.quotas: dict[str, list[Quota]] = {}
        for quota in snapshot.quotas:
            self.quotas.setdefault(quota.tenant, []).append(quota)
        # Per quota: GPUs held, and the VMs (then the plan's demands) holding them.
        self.held: dict[Quota, int] = dict.fromkeys(snapshot.quotas, 0)
        self.holders: dict[Quota, list[str]] = {quota: [] for quota in snapshot.quotas}
        for vm in snapshot.vms:
            for quota in self.quotas.get(vm.tenant, ()):  # type: ignore[arg-type]
                if quota.pool is None or quota.pool == vm.pool:
                    self.held[quota] += len(vm.gpus)
                    self.holders[quota].append(vm.id)

    def refusal(self, tenant: str | None, demands: list[Demand]) -> str | None:
        """Why the group ``demands`` of ``tenant`` may not be placed, or None if every quota of
        the tenant has room for all of it."""
        for quota in self.quotas.get(tenant, ()):  # type: ignore[arg-type]
            asked = _asked(quota, demands)
            if asked and self.held[quota] + asked > quota.max_gpus:
                return self._words(quota, asked)
        return None

    def add(self, tenant: str | None, demands: list[Demand]) -> None:
        """The group was placed: its GPUs count against the tenant's quotas from now on."""
        for quota in self.quotas.get(tenant, ()):  # type: ignore[arg-type]
            asked = _asked(quota, demands)
            if asked:
                self.held[quota] += asked
                self.holders[quota].extend(
                    demand.id for demand in demands if quota.pool in (None, demand.pool)
                )

    def _words(self, quota: Quota, asked: int) -> str:
        return explain.quota_reason(
            tenant=quota.tenant,
            scope=_scope_words(quota, self.set_name),
            max_gpus=quota.max_gpus,
            held=self.held[quota],
            holders=sorted(self.holders[quota]),
            asked=asked,
        )


def _asked(quota: Quota, demands: list[Demand]) -> int:
    return sum(demand.gpus for demand in demands if quota.pool in (None, demand.pool))


def _scope_words(quota: Quota, set_name: str | None) -> str:
    if quota.pool is not None:
        return f"quota in pool {quota.pool}"
    return f"quota in set {set_name}" if set_name else "quota for the whole set"
