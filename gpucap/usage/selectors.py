"""Reads of usage shared by the pages, the API and the exports."""

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.db import connection
from django.utils import timezone

from gpucap.fleet.models import CapacitySet, Pool
from gpucap.usage import pieces
from gpucap.usage.models import (
    KIND_LABELS,
    USAGE_KINDS,
    Allocation,
    BillingDelivery,
    BillingWebhook,
    UsageRecord,
)

# A piece with the names billing and people read: tenant, VM, pool, cluster, set, deployment;
# for a bare-metal rental's (no VM, no pool), the rental and its node.
USAGE_ROWS_SQL = """
SELECT r.record_id, r.period_start, r.started_at, r.ended_at, r.final, r.gpu_seconds,
       r.pool_kind, r.gpu_model, r.gpu_count, r.interval_id, r.allocation, r.commitment_id,
       r.commitment_name, r.borrowed_from, r.dedicated_node,
       r.tenant_id, t.slug AS tenant_slug, t.name AS tenant_name,
       r.vm_id, vm.name AS vm_name, vm.role AS vm_role,
       r.bare_metal_rental_id, bare.hostname AS node_hostname,
       pool.name AS pool_name, cluster.name AS cluster_name, cs.name AS capacity_set_name,
       d.slug AS deployment_slug
  FROM ({rows}) AS r
  JOIN tenancy_tenant t ON t.id = r.tenant_id
  LEFT JOIN rentals_virtualmachine vm ON vm.id = r.vm_id
  LEFT JOIN fleet_pool pool ON pool.id = r.pool_id
  LEFT JOIN bmc_baremetalrental rental ON rental.id = r.bare_metal_rental_id
  LEFT JOIN fleet_node bare ON bare.id = rental.node_id
  JOIN fleet_cluster cluster ON cluster.id = coalesce(pool.cluster_id, bare.cluster_id)
  LEFT JOIN fleet_capacityset cs ON cs.id = pool.capacity_set_id
  LEFT JOIN inference_inferencedeployment d ON d.id = r.deployment_id
 ORDER BY r.period_start, r.interval_id
"""


def usage_rows(
    *,
    since: datetime,
    until: datetime,
    tenant_id: int | None = None,
    allocation: str | None = None,
    now: datetime | None = None,
) -> Iterator[dict]:
    """Every piece of GPU time in [since, until), one per interval and period, oldest first;
    open intervals are counted up to ``now`` (``final`` is false on those rows); only GPU time
    of one ``allocation`` if given. One query, read in chunks from a server-side cursor so a
    month of a large fleet streams."""
    now = now or timezone.now()
    where = "TRUE" if tenant_id is None else "i.tenant_id = %(tenant_id)s"
    sql = USAGE_ROWS_SQL.format(rows=pieces.rows_sql(where=_of_allocation(where, allocation)))
    params = pieces.params(
        now=now, since=since, until=until, tenant_id=tenant_id, allocation=allocation
    )
    yield from _stream(sql, params)


def _of_allocation(where: str, allocation: str | None) -> str:
    return where if allocation is None else f"{where} AND i.allocation = %(allocation)s"


# Totals need no cut at period boundaries: each interval counts its part of [since, until).
TOTALS_BY_KIND_SQL = """
SELECT i.pool_kind,
       sum(extract(epoch FROM least(coalesce(i.ended_at, %(now)s), %(until)s)
                              - greatest(i.started_at, %(since)s)) * i.gpu_count)
  FROM usage_usageinterval i
 WHERE i.started_at < %(until)s
   AND coalesce(i.ended_at, %(now)s) > %(since)s
   AND {where}
 GROUP BY i.pool_kind
"""


def gpu_hours_by_pool_kind(
    *, tenant_id: int | None, since: datetime, until: datetime, now: datetime | None = None
) -> dict[str, Decimal]:
    """GPU-hours in [since, until) per pool kind (open intervals up to now), in one query."""
    now = now or timezone.now()
    where = "TRUE" if tenant_id is None else "i.tenant_id = %(tenant_id)s"
    params = {"now": now, "since": since, "until": until, "tenant_id": tenant_id}
    with connection.cursor() as cursor:
        cursor.execute(TOTALS_BY_KIND_SQL.format(where=where), params)
        return {kind: seconds / 3600 for kind, seconds in cursor.fetchall()}


def month_bounds(moment: datetime) -> tuple[datetime, datetime]:
    """The calendar month (UTC) ``moment`` falls in: [first day, first day of the next)."""
    moment = moment.astimezone(UTC)
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    return start, end


def usage_rows_of_tenants(
    *,
    since: datetime,
    until: datetime,
    tenant_ids: list[int],
    allocation: str | None = None,
    now: datetime | None = None,
) -> Iterator[dict]:
    """``usage_rows`` for several tenants at once (a member of more than one asking for all of
    theirs): the same rows, the same order, one streaming query."""
    now = now or timezone.now()
    where = _of_allocation("i.tenant_id = ANY(%(tenant_ids)s)", allocation)
    sql = USAGE_ROWS_SQL.format(rows=pieces.rows_sql(where=where))
    params = pieces.params(
        now=now, since=since, until=until, tenant_ids=list(tenant_ids), allocation=allocation
    )
    yield from _stream(sql, params)


def _stream(sql: str, params: dict) -> Iterator[dict]:
    """The rows of ``sql`` as dicts, read in chunks from a server-side cursor."""
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, params)
        columns = [column.name for column in cursor.description]
        while chunk := cursor.fetchmany(2000):
            for values in chunk:
                yield dict(zip(columns, values, strict=True))


# --- usage per day, for the usage pages' totals and charts -------------------------------------

# A piece never crosses midnight (periods divide a day and start at midnight UTC), so its
# start's UTC date is its day.
BY_DAY_SQL = """
SELECT (r.started_at AT TIME ZONE 'UTC')::date AS day, r.tenant_id, t.slug, t.name,
       r.pool_kind, r.allocation, sum(r.gpu_seconds) AS gpu_seconds
  FROM ({rows}) AS r
  JOIN tenancy_tenant t ON t.id = r.tenant_id
 GROUP BY 1, 2, 3, 4, 5, 6
 ORDER BY 1, 4, 5, 6
"""

# The tenant's page shows its GPU-hours in this order: what it pays for first.
ALLOCATIONS = ("dedicated", "reserved", "borrowed", "shared")


@dataclass(frozen=True)
class TenantUsage:
    slug: str
    name: str
    gpu_hours: Decimal
    by_kind: dict[str, Decimal]  # every pool kind, 0 where none

    @property
    def kinds(self) -> list[Decimal]:
        """GPU-hours in USAGE_KINDS order, for a table row."""
        return [self.by_kind[kind] for kind in USAGE_KINDS]


@dataclass(frozen=True)
class UsageSummary:
    """GPU-hours in [since, until): in all, per pool kind, per tenant (most first) and per day.
    Open intervals count up to the moment it was read."""

    since: datetime
    until: datetime
    days: list[date]
    gpu_hours: Decimal
    by_kind: dict[str, Decimal]  # every pool kind, 0 where none
    tenants: list[TenantUsage]
    daily_by_kind: dict[str, list[Decimal]]  # kind -> one value per day of ``days``
    daily_by_tenant: dict[str, list[Decimal]]  # tenant slug -> one value per day of ``days``
    by_allocation: dict[str, Decimal]  # every allocation, 0 where none

    @property
    def kinds(self) -> list[tuple[str, str, Decimal]]:
        """(kind, its label, GPU-hours) for every kind (pool kinds, then bare metal)."""
        return [(kind, KIND_LABELS[kind], self.by_kind[kind]) for kind in USAGE_KINDS]

    @property
    def allocations(self) -> list[tuple[str, str, Decimal]]:
        """(allocation, its label, GPU-hours) for every allocation."""
        return [(a, Allocation(a).label, self.by_allocation[a]) for a in ALLOCATIONS]


def usage_summary(
    *,
    since: datetime,
    until: datetime,
    tenant_id: int | None = None,
    now: datetime | None = None,
) -> UsageSummary:
    """Everything the usage pages show about a period, from one query: GPU-seconds summed per
    day, tenant, pool kind and allocation."""
    now = now or timezone.now()
    where = "TRUE" if tenant_id is None else "i.tenant_id = %(tenant_id)s"
    sql = BY_DAY_SQL.format(rows=pieces.rows_sql(where=where))
    params = pieces.params(now=now, since=since, until=until, tenant_id=tenant_id)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()

    days = _days(since, until)
    index = {day: n for n, day in enumerate(days)}
    zero = Decimal(0)
    by_kind = dict.fromkeys(USAGE_KINDS, zero)
    by_allocation = dict.fromkeys(ALLOCATIONS, zero)
    daily_by_kind = {kind: [zero] * len(days) for kind in USAGE_KINDS}
    daily_by_tenant: dict[str, list[Decimal]] = {}
    tenants: dict[str, tuple[str, dict[str, Decimal]]] = {}
    for day, _tenant_id, slug, name, kind, allocation, seconds in rows:
        hours = seconds / 3600
        by_kind[kind] += hours
        by_allocation[allocation] += hours
        daily_by_kind[kind][index[day]] += hours
        daily_by_tenant.setdefault(slug, [zero] * len(days))[index[day]] += hours
        tenants.setdefault(slug, (name, dict.fromkeys(USAGE_KINDS, zero)))[1][kind] += hours
    tenant_usage = sorted(
        (
            TenantUsage(slug=slug, name=name, gpu_hours=sum(kinds.values()), by_kind=kinds)
            for slug, (name, kinds) in tenants.items()
        ),
        key=lambda usage: (-usage.gpu_hours, usage.name),
    )
    return UsageSummary(
        since=since,
        until=until,
        days=days,
        gpu_hours=sum(by_kind.values()),
        by_kind=by_kind,
        tenants=tenant_usage,
        daily_by_kind=daily_by_kind,
        daily_by_tenant=daily_by_tenant,
        by_allocation=by_allocation,
    )


def _days(since: datetime, until: datetime) -> list[date]:
    first = since.astimezone(UTC).date()
    last = (until.astimezone(UTC) - timedelta(microseconds=1)).date()
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


# --- GPUs held per pool of a capacity set, for the set page's chart ---------------------------

# Each step's GPU-seconds per pool, divided by the part of the step inside [since, until): the
# average number of GPUs the pool held during it.
HELD_PER_POOL_SQL = """
SELECT s.step_start, vm.pool_id,
       sum(i.gpu_count * extract(epoch FROM
               least(coalesce(i.ended_at, %(now)s), s.step_start + %(step)s, %(until)s)
               - greatest(i.started_at, s.step_start)))
         / extract(epoch FROM least(s.step_start + %(step)s, %(until)s) - s.step_start)
         AS gpus
  FROM usage_usageinterval i
  JOIN rentals_virtualmachine vm ON vm.id = i.vm_id
  JOIN fleet_pool pool ON pool.id = vm.pool_id
  CROSS JOIN LATERAL generate_series(
       date_bin(%(step)s, greatest(i.started_at, %(since)s), %(since)s),
       least(coalesce(i.ended_at, %(now)s), %(until)s) - interval '1 microsecond',
       %(step)s) AS s(step_start)
 WHERE pool.capacity_set_id = %(capacity_set_id)s
   AND i.started_at < %(until)s
   AND coalesce(i.ended_at, %(now)s) > %(since)s
 GROUP BY 1, 2
"""


@dataclass(frozen=True)
class PoolHeld:
    pool: Pool
    gpus: list[float]  # average GPUs held in each step of ``GpusHeld.steps``


@dataclass(frozen=True)
class GpusHeld:
    since: datetime
    until: datetime
    step: timedelta
    steps: list[datetime]
    pools: list[PoolHeld]  # every pool of the set, in rank order


def gpus_held_per_pool(
    *,
    capacity_set: CapacitySet,
    since: datetime,
    until: datetime,
    step: timedelta = timedelta(hours=1),
    now: datetime | None = None,
) -> GpusHeld:
    """The average number of GPUs each pool of the set held in each ``step`` of [since, until)
    (``since`` is the first step's start), from the lifecycle's usage intervals; open intervals
    count up to ``now``. Two queries: the set's pools, then the sums."""
    now = now or timezone.now()
    pools = list(capacity_set.pools.order_by("rank"))
    with connection.cursor() as cursor:
        cursor.execute(
            HELD_PER_POOL_SQL,
            {
                "now": now,
                "since": since,
                "until": until,
                "step": step,
                "capacity_set_id": capacity_set.pk,
            },
        )
        rows = cursor.fetchall()
    count = -(-(until - since) // step)  # the last step may end at ``until``, before it is whole
    steps = [since + n * step for n in range(count)]
    index = {moment: n for n, moment in enumerate(steps)}
    held = {pool.pk: [0.0] * count for pool in pools}
    for step_start, pool_id, gpus in rows:
        held[pool_id][index[step_start]] = float(gpus)
    return GpusHeld(
        since=since,
        until=until,
        step=step,
        steps=steps,
        pools=[PoolHeld(pool=pool, gpus=held[pool.pk]) for pool in pools],
    )


# --- the billing webhook's page: its settings and state, records waiting, latest deliveries
@dataclass(frozen=True)
class BillingStatus:
    webhook: BillingWebhook | None
    waiting: int  # records the receiver has not accepted yet
    deliveries: list[BillingDelivery]


def billing_status(*, deliveries: int = 20) -> BillingStatus:
    hook = BillingWebhook.objects.filter(pk=BillingWebhook.SINGLETON).first()
    cursor = hook.cursor if hook else 0
    return BillingStatus(
        webhook=hook,
        waiting=UsageRecord.objects.filter(id__gt=cursor).count(),
        deliveries=list(BillingDelivery.objects.order_by("-at", "-id")[:deliveries]),
    )
