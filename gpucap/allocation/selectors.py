"""Reads of tenant allocation shared by the services, the pages, the API and the snapshot.

What a tenant uses in a quota's scope (its pool, or every pool of its GPU model):

- **held**: the GPUs of its VMs holding GPUs or reserved for them (provisioning, running,
  notified, stopping: ``gpucap.rentals.services.HOLDING``);
- **pending**: its requests waiting for capacity (``pending``), and their GPUs.

The VMs are read through the app registry (``apps.get_model``), not by importing the rentals
app, which sits above this one (.importlinter): the state names below are the rentals'
(a test holds them equal).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.apps import apps
from django.db.models import Q, Sum

from gpucap.allocation.models import Reservation, TenantQuota
from gpucap.arbiter import model as am
from gpucap.fleet.models import CapacitySet, Node, Pool
from gpucap.schedules import calendar
from gpucap.tenancy.models import Tenant

HELD_STATES = ("provisioning", "running", "notified", "stopping")
PENDING_STATE = "pending"
# How many VMs a message names before "and N more".
NAMED = 8


@dataclass
class QuotaUse:
    """What a tenant uses in one quota's scope."""

    held_gpus: int = 0
    pending_gpus: int = 0
    held_vms: list[str] = field(default_factory=list)
    pending_vms: list[str] = field(default_factory=list)

    @property
    def pending(self) -> int:
        return len(self.pending_vms)

    @property
    def gpus(self) -> int:
        return self.held_gpus + self.pending_gpus


def names_words(names: list[str]) -> str:
    """Up to eight names, then "and N more"."""
    shown = ", ".join(sorted(names)[:NAMED])
    more = len(names) - NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def quotas_with_use(*, tenant_ids: list[int] | None = None) -> list[tuple[TenantQuota, QuotaUse]]:
    """Every quota (of ``tenant_ids`` when given) with its use, by tenant then scope. Two
    queries, whatever the number of quotas and VMs."""
    quotas = TenantQuota.objects.select_related("tenant", "pool", "pool__capacity_set")
    if tenant_ids is not None:
        quotas = quotas.filter(tenant_id__in=tenant_ids)
    quotas = list(quotas)
    uses = quota_uses(quotas)
    return [(quota, uses[quota.pk]) for quota in quotas]


def quota_uses(quotas: list[TenantQuota]) -> dict[int, QuotaUse]:
    """Each quota's use, by quota id: one query (none for no quota)."""
    if not quotas:
        return {}
    rows = _uses({quota.tenant_id for quota in quotas})
    return {quota.pk: _use_of(quota, rows) for quota in quotas}


def quota_use(quota: TenantQuota) -> QuotaUse:
    """One quota's use (one query)."""
    return _use_of(quota, _uses({quota.tenant_id}))


def quota_refusal(*, tenant: Tenant, pool: Pool, gpu_count: int) -> dict[str, str]:
    """Why a new request of ``gpu_count`` GPUs in ``pool`` would take ``tenant`` past one of
    its quotas (``{field: words}``; empty when it would not): held + pending + this request's
    GPUs over ``max_gpus`` (field ``gpu_count``), or as many requests pending as
    ``max_pending`` allows already (field ``pool``)."""
    quotas = list(
        TenantQuota.objects.filter(
            Q(pool=pool) | Q(pool=None, gpu_model=pool.gpu_model), tenant=tenant
        ).select_related("pool")
    )
    if not quotas:
        return {}
    uses = _uses({tenant.pk})
    for quota in quotas:
        use = _use_of(quota, uses)
        if use.gpus + gpu_count > quota.max_gpus:
            return {"gpu_count": _over_gpus_words(tenant, quota, use, gpu_count)}
        if quota.max_pending is not None and use.pending >= quota.max_pending:
            return {
                "pool": (
                    f"over {tenant.slug}'s quota {quota.scope_words}: at most "
                    f"{quota.max_pending} pending request{'s' * (quota.max_pending != 1)}; "
                    f"{tenant.slug} has {use.pending} waiting"
                    + (f" ({names_words(use.pending_vms)})" if use.pending_vms else "")
                )
            }
    return {}


def _over_gpus_words(tenant: Tenant, quota: TenantQuota, use: QuotaUse, asked: int) -> str:
    held = f"{tenant.slug} holds {use.held_gpus}"
    if use.held_vms:
        held += f" ({names_words(use.held_vms)})"
    if use.pending_vms:
        held += f", has {use.pending_gpus} pending ({names_words(use.pending_vms)})"
    return (
        f"over {tenant.slug}'s quota {quota.scope_words}: {quota.max_gpus} GPUs; "
        f"{held} and asks for {asked}"
    )


def set_quotas(*, capacity_set: CapacitySet, pools: list[Pool]) -> tuple[am.Quota, ...]:
    """The quotas the arbiter applies to one set's plan (``pools``: the set's pools)."""
    return snapshot_quotas(gpu_model=capacity_set.gpu_model, pools=pools)


def snapshot_quotas(*, gpu_model: str, pools: list[Pool]) -> tuple[am.Quota, ...]:
    """The quotas the arbiter applies to a plan over ``pools`` (a set's, or a cluster's
    standalone pools of one hardware class) of ``gpu_model``. A pool quota enters as it is; a
    GPU-model quota spans every set (and standalone pool) of that model while a plan sees only
    ``pools``, so it enters as the snapshot's whole quota (``pool`` None) with the headroom left
    here: ``max_gpus`` minus what the tenant holds in the model's other pools (never below 0).
    Pending requests elsewhere are not counted: they are refused at request time when they
    would not fit (``quota_refusal``). Two queries, one when no GPU-model quota applies."""
    pool_ids = {pool.pk: pool.name for pool in pools}
    quotas = list(
        TenantQuota.objects.filter(
            Q(pool_id__in=pool_ids) | Q(pool=None, gpu_model=gpu_model)
        ).select_related("tenant")
    )
    model_quotas = [quota for quota in quotas if quota.pool_id is None]
    held_elsewhere: dict[int, int] = defaultdict(int)
    if model_quotas:
        rows = (
            _vms()
            .objects.filter(
                tenant_id__in={quota.tenant_id for quota in model_quotas},
                state__in=HELD_STATES,
                pool__gpu_model=gpu_model,
            )
            .exclude(pool_id__in=pool_ids)
            .values_list("tenant_id", "gpu_count")
        )
        for tenant_id, gpu_count in rows:
            held_elsewhere[tenant_id] += gpu_count
    return tuple(
        sorted(
            (
                am.Quota(
                    tenant=quota.tenant.slug,
                    pool=pool_ids[quota.pool_id] if quota.pool_id is not None else None,
                    max_gpus=(
                        quota.max_gpus
                        if quota.pool_id is not None
                        else max(0, quota.max_gpus - held_elsewhere[quota.tenant_id])
                    ),
                )
                for quota in quotas
            ),
            key=lambda quota: (quota.tenant, quota.pool or ""),
        )
    )


# --- use -----------------------------------------------------------------------------------------

# (tenant id, pool id, GPU model, state, GPUs, name) of every VM holding or waiting.
_Row = tuple[int, int, str, str, int, str]


def _vms():
    """The rentals' VM model, by name: that app sits above this one."""
    return apps.get_model("rentals", "VirtualMachine")


def _uses(tenant_ids: set[int]) -> list[_Row]:
    return list(
        _vms()
        .objects.filter(tenant_id__in=tenant_ids, state__in=(*HELD_STATES, PENDING_STATE))
        .order_by("name")
        .values_list("tenant_id", "pool_id", "pool__gpu_model", "state", "gpu_count", "name")
    )


def _use_of(quota: TenantQuota, rows: list[_Row]) -> QuotaUse:
    use = QuotaUse()
    for tenant_id, pool_id, gpu_model, state, gpu_count, name in rows:
        if tenant_id != quota.tenant_id:
            continue
        if quota.pool_id is not None and pool_id != quota.pool_id:
            continue
        if quota.pool_id is None and gpu_model != quota.gpu_model:
            continue
        if state == PENDING_STATE:
            use.pending_gpus += gpu_count
            use.pending_vms.append(name)
        else:
            use.held_gpus += gpu_count
            use.held_vms.append(name)
    return use


# --- reservations ------------------------------------------------------------------------------

# How far ahead a reservation's next change is looked for (a weekly window repeats within 8 days).
RESERVATION_LOOKAHEAD = timedelta(days=8)


def reservation_window(reservation: Reservation) -> calendar.Window | None:
    """The reservation's weekly window as the schedules' calendar reads it; None: always."""
    if reservation.always:
        return None
    return calendar.Window(
        days=frozenset(reservation.days),
        start=reservation.start_time,
        end=reservation.end_time,
        zone=reservation.time_zone,
    )


def reservation_in_force(reservation: Reservation, now: datetime) -> bool:
    window = reservation_window(reservation)
    return window is None or window.active_at(now)


def reservations_in_force(
    capacity_set: CapacitySet, now: datetime, *, order_by: str = "name"
) -> list[Reservation]:
    """The set's reservations in force at ``now`` (one query), by name unless told: the
    snapshot hands the arbiter them oldest first (``order_by="pk"``), the order in which a set
    too small for all of them honours them."""
    rows = Reservation.objects.filter(capacity_set=capacity_set).select_related("tenant")
    return [row for row in rows.order_by(order_by) if reservation_in_force(row, now)]


def reservation_next_change(reservation: Reservation, now: datetime) -> datetime | None:
    """When the reservation next comes into or goes out of force after ``now``; None for one
    always in force."""
    window = reservation_window(reservation)
    if window is None:
        return None
    return window_next_change(window, now)


def window_next_change(window: calendar.Window, now: datetime) -> datetime | None:
    entry = calendar.Entry(name="reservation", window=window, changes=())
    moments = calendar.boundaries([entry], [], now, now + RESERVATION_LOOKAHEAD)
    return moments[0] if moments else None


def set_next_reservation_change(capacity_set_id: int, now: datetime) -> datetime | None:
    """The next moment any of the set's reservations comes into or out of force."""
    moments = [
        moment
        for row in Reservation.objects.filter(capacity_set_id=capacity_set_id, always=False)
        if (moment := reservation_next_change(row, now)) is not None
    ]
    return min(moments, default=None)


def set_reservable_gpus(capacity_set: CapacitySet) -> int:
    """The GPUs a set's reservations may keep: those of its ready nodes not dedicated to a
    tenant (a dedicated node is its tenant's already, and no one else's to keep)."""
    total = Node.objects.filter(
        capacity_set=capacity_set, state=Node.State.READY, dedicated_tenant__isnull=True
    ).aggregate(gpus=Sum("gpu_count"))["gpus"]
    return total or 0


def reservations_borrowers(
    reservation_ids: list[int],
) -> dict[int, list[tuple[str, str, str | None, int]]]:
    """The VMs borrowing from each reservation now: (VM name, tenant slug, node hostname,
    GPUs), by reservation id (one query)."""
    found: dict[int, list[tuple[str, str, str | None, int]]] = {pk: [] for pk in reservation_ids}
    rows = (
        _vms()
        .objects.filter(borrowed_from_id__in=reservation_ids, state__in=HELD_STATES)
        .order_by("name")
        .values_list("borrowed_from_id", "name", "tenant__slug", "node__hostname", "gpu_count")
    )
    for reservation_id, name, tenant, node, gpus in rows:
        found[reservation_id].append((name, tenant, node, gpus))
    return found


def reservations_held(reservation_ids: list[int]) -> dict[int, int]:
    """The GPUs each reservation's tenant holds inside it now (VMs placed in it), by id."""
    held: dict[int, int] = dict.fromkeys(reservation_ids, 0)
    rows = (
        _vms()
        .objects.filter(reservation_id__in=reservation_ids, state__in=HELD_STATES)
        .values("reservation_id")
        .annotate(gpus=Sum("gpu_count"))
    )
    for row in rows:
        held[row["reservation_id"]] = row["gpus"]
    return held
