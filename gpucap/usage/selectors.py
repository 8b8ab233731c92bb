"""Reads of usage shared by the pages, the API and the exports."""

from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal

from django.db import connection
from django.utils import timezone

from gpucap.usage import pieces

# A piece with the names billing and people read: tenant, VM, pool, cluster, set, deployment.
USAGE_ROWS_SQL = """
SELECT r.record_id, r.period_start, r.started_at, r.ended_at, r.final, r.gpu_seconds,
       r.pool_kind, r.gpu_model, r.gpu_count, r.interval_id,
       r.tenant_id, t.slug AS tenant_slug, t.name AS tenant_name,
       r.vm_id, vm.name AS vm_name, vm.role AS vm_role,
       pool.name AS pool_name, cluster.name AS cluster_name, cs.name AS capacity_set_name,
       d.slug AS deployment_slug
  FROM ({rows}) AS r
  JOIN tenancy_tenant t ON t.id = r.tenant_id
  JOIN rentals_virtualmachine vm ON vm.id = r.vm_id
  JOIN fleet_pool pool ON pool.id = r.pool_id
  JOIN fleet_cluster cluster ON cluster.id = pool.cluster_id
  LEFT JOIN fleet_capacityset cs ON cs.id = pool.capacity_set_id
  LEFT JOIN inference_inferencedeployment d ON d.id = r.deployment_id
 ORDER BY r.period_start, r.interval_id
"""


def usage_rows(
    *,
    since: datetime,
    until: datetime,
    tenant_id: int | None = None,
    now: datetime | None = None,
) -> Iterator[dict]:
    """Every piece of GPU time in [since, until), one per interval and period, oldest first;
    open intervals are counted up to ``now`` (``final`` is false on those rows). One query,
    read in chunks from a server-side cursor so a month of a large fleet streams."""
    now = now or timezone.now()
    where = "TRUE" if tenant_id is None else "i.tenant_id = %(tenant_id)s"
    sql = USAGE_ROWS_SQL.format(rows=pieces.rows_sql(where=where))
    params = pieces.params(now=now, since=since, until=until, tenant_id=tenant_id)
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, params)
        columns = [column.name for column in cursor.description]
        while chunk := cursor.fetchmany(2000):
            for values in chunk:
                yield dict(zip(columns, values, strict=True))


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
    moment = moment.astimezone(timezone.UTC)
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    return start, end
