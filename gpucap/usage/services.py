"""Changes to usage: making the records billing receives from the lifecycle's intervals."""

from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from gpucap import locks
from gpucap.usage import pieces

# Intervals that may still give records; the same predicate as the partial index
# usage_interval_unrecorded, so PostgreSQL reads only those.
UNRECORDED = "(i.ended_at IS NULL OR i.recorded_until IS NULL OR i.recorded_until < i.ended_at)"

INSERT_RECORDS_SQL = """
INSERT INTO usage_usagerecord
       (record_id, interval_id, tenant_id, vm_id, deployment_id, pool_id, pool_kind, gpu_model,
        gpu_count, period_start, started_at, ended_at, gpu_seconds, created_at)
SELECT record_id, interval_id, tenant_id, vm_id, deployment_id, pool_id, pool_kind, gpu_model,
       gpu_count, period_start, started_at, ended_at, gpu_seconds, %(now)s
  FROM ({rows}) AS rows
 ORDER BY period_start, interval_id
    ON CONFLICT (interval_id, period_start) DO NOTHING
"""

MARK_RECORDED_SQL = f"""
UPDATE usage_usageinterval i
   SET recorded_until = coalesce(i.ended_at, %(recorded_until)s)
 WHERE {UNRECORDED}
   AND (i.recorded_until IS NULL OR i.recorded_until < coalesce(i.ended_at, %(recorded_until)s))
   AND (i.ended_at IS NOT NULL OR i.started_at < %(recorded_until)s)
"""


@transaction.atomic
def usage_record(*, now: datetime | None = None) -> int:
    """Make a record for every piece of an interval whose end is final: the period is over, or
    the interval has ended. Returns how many were made.

    Runs under one advisory lock, so record ids become visible in increasing order (the
    webhook's cursor relies on it); a second run, or a run after a crash, makes nothing twice:
    a piece has one record (a unique constraint), and intervals remember how far they are
    recorded."""
    now = now or timezone.now()
    recorded_until = pieces.period_floor(now)
    locks.xact_lock(locks.USAGE, 0)
    rows = pieces.rows_sql(
        where=UNRECORDED,
        since="coalesce(i.recorded_until, i.started_at)",
        until="coalesce(i.ended_at, %(recorded_until)s)",
    )
    params = pieces.params(now=now, recorded_until=recorded_until)
    with connection.cursor() as cursor:
        cursor.execute(INSERT_RECORDS_SQL.format(rows=rows), params)
        made = cursor.rowcount
        cursor.execute(MARK_RECORDED_SQL, params)
    return made
