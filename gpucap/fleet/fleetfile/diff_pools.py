"""Comparing a fleet file's pools with the database: part of `FleetDiff`."""

from collections import defaultdict

from gpucap.fleet import rules
from gpucap.fleet.fleetfile.spec import PoolSpec
from gpucap.fleet.fleetfile.words import fixed_field, group_text


class PoolsDiff:
    """Pools: references, ranks (one re-rank per group whose order changes), floors and
    tenants. A part of `FleetDiff`, which holds the file, the database's rows and the
    bookkeeping used here."""

    def _plan_pools(self) -> None:
        tenant_slugs = set(self.tenants) | {t.slug for t in self.file.tenants}
        groups: dict[tuple, list[PoolSpec]] = defaultdict(list)
        for spec in self.file.pools:
            fine = self._check_pool_refs(spec, tenant_slugs)
            pool = self.pools.get(spec.name)
            if pool is not None:
                now = {
                    "kind": pool.kind,
                    "cluster": pool.cluster.name,
                    "capacity_set": pool.capacity_set.name if pool.capacity_set else None,
                    "gpu_model": pool.gpu_model,
                    "fabric": pool.fabric,
                }
                for field, value in now.items():
                    wanted = getattr(spec, field)
                    if field in ("gpu_model", "fabric") and (
                        wanted is None or pool.capacity_set is not None
                    ):
                        continue  # a set's pool rents its set's GPUs: checked with the set
                    if wanted != value:
                        fine = False
                        self._problem(
                            spec.where,
                            fixed_field(
                                field, spec.name, value or "none", wanted or "none", "pool"
                            ),
                        )
            if fine:
                groups[(spec.cluster, spec.capacity_set)].append(spec)
        for (cluster, set_name), specs in groups.items():
            self._plan_pool_group(cluster, set_name, specs)

    def _check_pool_refs(self, spec: PoolSpec, tenant_slugs: set[str]) -> bool:
        fine = True
        if not self._cluster_known(spec.cluster):
            fine = False
            self._problem(
                spec.where, f"cluster: no cluster named {spec.cluster} in the file or the database"
            )
        if spec.capacity_set is not None:
            facts = self._set_facts(spec.capacity_set)
            if facts is None:
                fine = False
                self._problem(
                    spec.where,
                    f"capacity_set: no capacity set named "
                    f"{spec.capacity_set} in the file or the database",
                )
            elif facts[0] != spec.cluster:
                fine = False
                self._problem(
                    spec.where,
                    f"capacity_set: {spec.capacity_set} belongs to cluster "
                    f"{facts[0]}, not {spec.cluster}",
                )
            else:
                rents = rules.set_pool_gpu_problems(
                    set_name=spec.capacity_set,
                    set_gpu_model=facts[1],
                    set_fabric=facts[2],
                    gpu_model=spec.gpu_model,
                    fabric=spec.fabric,
                )
                for field, problem in rents.items():
                    fine = False
                    self._problem(
                        spec.where, f"{field}: {problem}; leave {field} out for a pool in a set"
                    )
        unknown = [slug for slug in spec.tenants if slug not in tenant_slugs]
        if unknown:
            fine = False
            self._problem(
                spec.where, f"tenants: no tenant {', '.join(unknown)} in the file or the database"
            )
        return fine

    def _plan_pool_group(self, cluster: str, set_name: str | None, specs: list[PoolSpec]) -> None:
        """Ranks, floors and tenants of the pools of one set (or of one cluster's standalone
        pools). A change of order goes through one re-rank of the whole group."""
        group = group_text(cluster, set_name)
        in_file = {spec.name for spec in specs}
        others = {
            pool.name: pool.rank
            for pool in self.pools.values()
            if pool.name not in in_file
            and pool.cluster.name == cluster
            and (pool.capacity_set.name if pool.capacity_set else None) == set_name
        }
        holders = {rank: name for name, rank in others.items()}
        for spec in specs:
            if spec.rank in holders:
                name = holders[spec.rank]
                self._problem(
                    spec.where,
                    f"rank: {spec.rank} is held by {name} (one of {group}), which is not in "
                    f"this file; declare {name} in the file to re-rank it",
                )
        desired = {spec.name: spec.rank for spec in specs} | others
        moved = [s for s in specs if s.name in self.pools and self.pools[s.name].rank != s.rank]
        new = [s for s in specs if s.name not in self.pools]
        create_rank = {spec.name: spec.rank for spec in new}
        if moved:
            ranks = sorted(desired.values())
            if ranks != list(range(1, len(ranks) + 1)):
                self._problem(
                    moved[0].where,
                    f"rank: changing ranks re-ranks {group} as 1..{len(ranks)}; "
                    f"give them ranks 1..{len(ranks)} (now {', '.join(map(str, ranks))})",
                )
            # New pools wait above every rank in use until the one re-rank places them.
            spare = max([*desired.values(), *(p.rank for p in self.pools.values())], default=0)
            create_rank = {spec.name: spare + k for k, spec in enumerate(new, start=1)}
            order = sorted(desired, key=desired.__getitem__)
            self._step(
                "ranks",
                moved[0].where,
                "pools_rerank",
                cluster=cluster,
                capacity_set=set_name,
                order=order,
            )
        for spec in specs:
            self._plan_pool(spec, create_rank.get(spec.name))

    def _plan_pool(self, spec: PoolSpec, create_rank: int | None) -> None:
        pool = self.pools.get(spec.name)
        tenants = ", ".join(spec.tenants) or "none"
        if pool is None:
            where_to = (
                f"set {spec.capacity_set}"
                if spec.capacity_set
                else f"standalone on {spec.cluster} ({spec.gpu_model} {spec.fabric})"
            )
            self._change(
                "create",
                "pool",
                spec.name,
                f"{spec.kind}, {where_to}, rank {spec.rank}, floor {spec.floor_gpus} GPUs, "
                + (f"protects VMs for {spec.protect_seconds} s, " if spec.protect_seconds else "")
                + f"tenants {tenants}",
            )
            self._step("pools", spec.where, "pool_create", spec=spec, rank=create_rank)
            if spec.tenants:
                self._step(
                    "pool_tenants",
                    spec.where,
                    "pool_set_tenants",
                    name=spec.name,
                    slugs=spec.tenants,
                )
            return
        details = []
        if pool.rank != spec.rank:
            details.append(f"rank {pool.rank} -> {spec.rank}")
        if pool.floor_gpus != spec.floor_gpus:
            details.append(f"floor_gpus {pool.floor_gpus} -> {spec.floor_gpus}")
            phase = "floors_down" if spec.floor_gpus < pool.floor_gpus else "floors_up"
            self._step(phase, spec.where, "pool_set_floor", pool=pool, floor_gpus=spec.floor_gpus)
        if pool.protect_seconds != spec.protect_seconds:
            details.append(f"protect_seconds {pool.protect_seconds} -> {spec.protect_seconds}")
            self._step(
                "floors_up",
                spec.where,
                "pool_set_protect",
                pool=pool,
                protect_seconds=spec.protect_seconds,
            )
        now = tuple(sorted(t.slug for t in pool.tenants.all()))
        if now != spec.tenants:
            details.append(f"tenants {', '.join(now) or 'none'} -> {tenants}")
            self._step(
                "pool_tenants", spec.where, "pool_set_tenants", name=spec.name, slugs=spec.tenants
            )
        if details:
            self._change("update", "pool", spec.name, details)
        else:
            self.unchanged += 1

    def set_gpus_after(self) -> dict[str, int]:
        """Each set's GPUs once the file is applied."""
        node_sets = {
            key: (node.capacity_set.name if node.capacity_set else None, node.gpu_count)
            for key, node in self.nodes.items()
        }
        for spec in self.file.nodes:
            node_sets[(spec.cluster, spec.hostname)] = (spec.capacity_set, spec.gpu_count)
        totals: dict[str, int] = defaultdict(int)
        for set_name, gpu_count in node_sets.values():
            if set_name is not None:
                totals[set_name] += gpu_count
        return totals

    def pool_floors_after(self) -> dict[str, tuple[str | None, int]]:
        """Each pool's set and floor once the file is applied."""
        floors = {
            p.name: (p.capacity_set.name if p.capacity_set else None, p.floor_gpus)
            for p in self.pools.values()
        }
        for spec in self.file.pools:
            floors[spec.name] = (spec.capacity_set, spec.floor_gpus)
        return floors

    def _check_floors(self) -> None:
        """A set's floors must fit its GPUs once the file is applied; say so before applying."""
        set_now = {
            key: node.capacity_set.name if node.capacity_set else None
            for key, node in self.nodes.items()
        }
        totals = self.set_gpus_after()
        floors = self.pool_floors_after()
        for set_name in sorted({s for s, _ in floors.values() if s is not None}):
            held = {name: floor for name, (s, floor) in floors.items() if s == set_name and floor}
            total = totals.get(set_name, 0)
            if rules.floors_fit(floor_gpus=sum(held.values()), set_gpus=total):
                continue
            blamed = [spec for spec in self.file.pools if spec.name in held]
            listed = ", ".join(f"{name} {floor}" for name, floor in sorted(held.items()))
            text = (
                f"the floors of capacity set {set_name}'s pools add up to "
                f"{sum(held.values())} GPUs ({listed}), more than the set's {total} GPUs"
            )
            if blamed:
                worst = max(blamed, key=lambda spec: spec.floor_gpus)
                self._problem(worst.where, f"floor_gpus: {text}")
            else:
                leaving = [
                    spec
                    for spec in self.file.nodes
                    if set_now.get((spec.cluster, spec.hostname)) == set_name
                    and spec.capacity_set != set_name
                ]
                where = leaving[0].where if leaving else f"capacity set {set_name}"
                self._problem(where, f"capacity_set: {text}")
