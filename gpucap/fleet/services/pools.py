"""Pools: ranked consumers of capacity, in a capacity set or standalone on their cluster."""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Sum

from gpucap.audit.services import Actor, audit_record
from gpucap.fleet import rules
from gpucap.fleet.models import CapacitySet, Cluster, Fabric, Pool
from gpucap.fleet.services._common import capacity_set_bump, delete_unused, field_change, lock_set
from gpucap.fleet.services.capacity_sets import capacity_set_gpu_total


@transaction.atomic
def pool_create(
    *,
    name: str,
    kind: str,
    cluster: Cluster,
    capacity_set: CapacitySet | None = None,
    rank: int,
    floor_gpus: int = 0,
    protect_seconds: int = 0,
    gpu_model: str = "",
    fabric: str = "",
    actor: Actor = None,
) -> Pool:
    """A pool in a capacity set rents the set's GPU model and fabric (given or not); a
    standalone pool names the model and fabric of the standalone nodes it places on."""
    # Lock the set (or, for a standalone pool, the cluster) first: two pools created at once
    # must not both pass the rank check.
    if capacity_set is not None and capacity_set.cluster_id == cluster.pk:
        lock_set(capacity_set)
    else:
        Cluster.objects.select_for_update().filter(pk=cluster.pk).first()
    errors = {}
    if Pool.objects.filter(name=name).exists():
        errors["name"] = f"a pool named {name!r} already exists"
    if kind not in Pool.Kind.values:
        errors["kind"] = f"unknown kind {kind!r}; choose one of {', '.join(Pool.Kind.values)}"
    if capacity_set is not None and capacity_set.cluster_id != cluster.pk:
        errors["capacity_set"] = (
            f"capacity set {capacity_set.name} belongs to cluster {capacity_set.cluster.name}, "
            f"not {cluster.name}"
        )
    if capacity_set is not None:
        errors.update(
            rules.set_pool_gpu_problems(
                set_name=capacity_set.name,
                set_gpu_model=capacity_set.gpu_model,
                set_fabric=capacity_set.fabric,
                gpu_model=gpu_model,
                fabric=fabric,
            )
        )
        gpu_model, fabric = capacity_set.gpu_model, capacity_set.fabric
    else:
        if not gpu_model:
            errors["gpu_model"] = "a standalone pool must name the GPU model it rents"
        if fabric not in Fabric.values:
            errors["fabric"] = (
                f"a standalone pool must name its fabric: pcie or nvswitch, got {fabric!r}"
            )
    if not isinstance(rank, int) or rank < 1:
        errors["rank"] = f"must be a whole number of at least 1 (1 is the highest), got {rank!r}"
    elif _rank_taken(cluster=cluster, capacity_set=capacity_set, rank=rank):
        where = f"capacity set {capacity_set.name}" if capacity_set else f"cluster {cluster.name}"
        errors["rank"] = f"rank {rank} is already used by another pool in {where}"
    if problem := rules.protect_seconds_problem(protect_seconds):
        errors["protect_seconds"] = problem
    if errors:
        raise ValidationError(errors)
    _check_floor(
        capacity_set=capacity_set, floor_gpus=floor_gpus, other_pools=_pools_of(capacity_set)
    )
    pool = Pool.objects.create(
        name=name,
        kind=kind,
        cluster=cluster,
        capacity_set=capacity_set,
        rank=rank,
        floor_gpus=floor_gpus,
        protect_seconds=protect_seconds,
        gpu_model=gpu_model,
        fabric=fabric,
    )
    capacity_set_bump(capacity_set_id=pool.capacity_set_id)
    audit_record(
        actor=actor,
        verb="pool.create",
        target=pool,
        after={
            "kind": kind,
            "capacity_set": capacity_set.name if capacity_set else None,
            "gpu_model": gpu_model,
            "fabric": fabric,
            "rank": rank,
            "floor_gpus": floor_gpus,
            "protect_seconds": protect_seconds,
        },
    )
    return pool


def _rank_taken(*, cluster: Cluster, capacity_set: CapacitySet | None, rank: int) -> bool:
    if capacity_set is not None:
        return Pool.objects.filter(capacity_set=capacity_set, rank=rank).exists()
    return Pool.objects.filter(cluster=cluster, capacity_set=None, rank=rank).exists()


def _pools_of(capacity_set: CapacitySet | None):
    return Pool.objects.filter(capacity_set=capacity_set) if capacity_set else Pool.objects.none()


def _check_floor(*, capacity_set: CapacitySet | None, floor_gpus: int, other_pools) -> None:
    if not isinstance(floor_gpus, int) or floor_gpus < 0:
        raise ValidationError({"floor_gpus": f"must be 0 or more GPUs, got {floor_gpus!r}"})
    if capacity_set is None:
        return
    total = capacity_set_gpu_total(capacity_set=capacity_set)
    others = other_pools.aggregate(total=Sum("floor_gpus"))["total"] or 0
    if not rules.floors_fit(floor_gpus=floor_gpus + others, set_gpus=total):
        raise ValidationError(
            {
                "floor_gpus": f"a floor of {floor_gpus} GPUs plus the other pools' floors "
                f"({others}) exceeds the {total} GPUs of capacity set {capacity_set.name}"
            }
        )


@transaction.atomic
def pool_set_floor(*, pool: Pool, floor_gpus: int, actor: Actor = None) -> Pool:
    pool = Pool.objects.select_related("capacity_set").get(pk=pool.pk)
    if pool.capacity_set is not None:
        lock_set(pool.capacity_set)
    pool = (
        Pool.objects.select_for_update(of=("self",)).select_related("capacity_set").get(pk=pool.pk)
    )
    _check_floor(
        capacity_set=pool.capacity_set,
        floor_gpus=floor_gpus,
        other_pools=_pools_of(pool.capacity_set).exclude(pk=pool.pk),
    )
    return field_change(
        pool,
        "floor_gpus",
        floor_gpus,
        verb="pool.set_floor",
        actor=actor,
        capacity_set_id=pool.capacity_set_id,
    )


@transaction.atomic
def pool_set_protect(*, pool: Pool, protect_seconds: int, actor: Actor = None) -> Pool:
    """Protect the pool's VMs from reclaims for ``protect_seconds`` after they start or resume
    (0: off). The set is planned again: waits and victims may change."""
    if problem := rules.protect_seconds_problem(protect_seconds):
        raise ValidationError({"protect_seconds": problem})
    pool = Pool.objects.select_related("capacity_set").get(pk=pool.pk)
    if pool.capacity_set is not None:
        lock_set(pool.capacity_set)
    pool = (
        Pool.objects.select_for_update(of=("self",)).select_related("capacity_set").get(pk=pool.pk)
    )
    return field_change(
        pool,
        "protect_seconds",
        protect_seconds,
        verb="pool.set_protect",
        actor=actor,
        capacity_set_id=pool.capacity_set_id,
    )


@transaction.atomic
def pool_rerank(
    *,
    capacity_set: CapacitySet | None = None,
    cluster: Cluster | None = None,
    pool_names: list[str],
    actor: Actor = None,
) -> list[Pool]:
    """Give the pools of one ranking ranks 1..n in the order named: the pools of
    ``capacity_set``, or (no set given) the standalone pools of ``cluster``. Every pool of the
    ranking must be named exactly once; the change is atomic (no moment with two pools on one
    rank). Standalone pools are outside every set: no generation to bump."""
    if capacity_set is not None:
        lock_set(capacity_set)
        ranked = Pool.objects.filter(capacity_set=capacity_set)
        pools = {p.name: p for p in ranked.select_for_update()}
        strangers, everyone = f"not pools of {capacity_set.name}", "every pool of the set"
    elif cluster is not None:
        Cluster.objects.select_for_update().filter(pk=cluster.pk).first()
        ranked = Pool.objects.filter(cluster=cluster, capacity_set=None)
        # Only the pool rows: the default ordering joins the (absent) set, which cannot be
        # locked.
        pools = {p.name: p for p in ranked.select_for_update(of=("self",))}
        strangers = f"not standalone pools of cluster {cluster.name}"
        everyone = "every standalone pool"
    else:
        raise TypeError("pool_rerank needs a capacity set or, for standalone pools, a cluster")
    if not isinstance(pool_names, list) or not all(isinstance(n, str) for n in pool_names):
        raise ValidationError({"pools": "must be a list of pool names, highest priority first"})
    unknown = [n for n in pool_names if n not in pools]
    missing = sorted(set(pools) - set(pool_names))
    duplicated = sorted({n for n in pool_names if pool_names.count(n) > 1})
    problems = []
    if unknown:
        problems.append(f"{strangers}: {', '.join(unknown)}")
    if missing:
        problems.append(f"{everyone} must be ranked; missing: {', '.join(missing)}")
    if duplicated:
        problems.append(f"named more than once: {', '.join(duplicated)}")
    if problems:
        raise ValidationError({"pools": "; ".join(problems)})
    before = {name: pool.rank for name, pool in pools.items()}
    after = {name: position for position, name in enumerate(pool_names, start=1)}
    if before == after:
        return sorted(pools.values(), key=lambda p: p.rank)
    # Two steps keep the unique rank constraint true at every statement.
    offset = max(max(before.values()), len(pools)) + 1
    ranked.update(rank=F("rank") + offset)
    for name, rank in after.items():
        Pool.objects.filter(pk=pools[name].pk).update(rank=rank)
    if capacity_set is not None:
        capacity_set_bump(capacity_set_id=capacity_set.pk)
        audit_record(
            actor=actor, verb="capacity_set.rerank", target=capacity_set, before=before, after=after
        )
    else:
        audit_record(
            actor=actor,
            verb="cluster.rerank_standalone",
            target=cluster,
            before=before,
            after=after,
        )
    return list(ranked.order_by("rank"))


@transaction.atomic
def pool_set_tenants(*, pool: Pool, tenants: list, actor: Actor = None) -> Pool:
    """Say which tenants may use a pool."""
    before = sorted(pool.tenants.values_list("slug", flat=True))
    after = sorted(t.slug for t in tenants)
    if before != after:
        pool.tenants.set(tenants)
        audit_record(
            actor=actor,
            verb="pool.set_tenants",
            target=pool,
            before={"tenants": before},
            after={"tenants": after},
        )
    return pool


@transaction.atomic
def pool_delete(*, pool: Pool, actor: Actor = None) -> None:
    """Forget a pool that nothing runs in any more."""
    pool = Pool.objects.select_related("capacity_set").get(pk=pool.pk)
    if pool.capacity_set is not None:
        lock_set(pool.capacity_set)
    capacity_set_id = pool.capacity_set_id
    delete_unused(
        pool,
        what=f"pool {pool.name}",
        verb="pool.delete",
        before={
            "kind": pool.kind,
            "capacity_set": getattr(pool.capacity_set, "name", None),
            "rank": pool.rank,
            "floor_gpus": pool.floor_gpus,
        },
        actor=actor,
    )
    capacity_set_bump(capacity_set_id=capacity_set_id)
