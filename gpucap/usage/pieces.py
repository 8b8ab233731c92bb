"""Usage intervals cut at period boundaries, in SQL.

One interval becomes one piece per period it overlaps (``USAGE_PERIOD_SECONDS``, aligned to
midnight UTC), its end clipped to ``now`` while it is open. The same statement feeds the records
billing receives (``services.usage_record``) and the exports (``selectors.usage_rows``), so a
piece has the same ``record_id``, bounds and GPU-seconds wherever it is read. An interval is a
VM's (``vm_id``, with its pool and deployment) or a bare-metal rental's
(``bare_metal_rental_id``; the VM's columns are null).
"""

from datetime import datetime, timedelta

from django.conf import settings

# date_bin's origin: periods that divide a day start at midnight UTC.
ORIGIN = "2000-01-01 00:00:00+00"

# {since} and {until} bound the pieces (SQL: a parameter, or a column of the interval i);
# %(now)s ends the open intervals; {where} narrows the intervals.
PIECES_SQL = """
SELECT 'iv' || i.id || '-' || to_char(p.period_start AT TIME ZONE 'UTC',
                                      'YYYYMMDD"T"HH24MISS"Z"') AS record_id,
       i.id AS interval_id, i.tenant_id, i.vm_id, i.bare_metal_rental_id, vm.deployment_id,
       vm.pool_id,
       i.pool_kind, i.gpu_model, i.gpu_count, i.allocation, i.commitment_id, i.commitment_name,
       i.borrowed_from, i.dedicated_node, p.period_start,
       greatest(i.started_at, p.period_start) AS started_at,
       least(coalesce(i.ended_at, %(now)s), p.period_start + %(period)s) AS ended_at,
       i.ended_at IS NOT NULL AND i.ended_at <= p.period_start + %(period)s
           OR p.period_start + %(period)s <= %(now)s AS final
  FROM usage_usageinterval i
  LEFT JOIN rentals_virtualmachine vm ON vm.id = i.vm_id
  CROSS JOIN LATERAL generate_series(
       date_bin(%(period)s, greatest(i.started_at, {since}), %(origin)s),
       least(coalesce(i.ended_at, %(now)s), {until}) - interval '1 microsecond',
       %(period)s) AS p(period_start)
 WHERE i.started_at < {until}
   AND coalesce(i.ended_at, %(now)s) > {since}
   AND {where}
"""

# The pieces with their GPU-seconds, empty ones (an interval that ended as it began) left out.
ROWS_SQL = """
SELECT pieces.*,
       round(extract(epoch FROM pieces.ended_at - pieces.started_at) * pieces.gpu_count, 3)
           AS gpu_seconds
  FROM ({pieces}) AS pieces
 WHERE pieces.ended_at > pieces.started_at
"""


def period() -> timedelta:
    return timedelta(seconds=settings.USAGE_PERIOD_SECONDS)


def period_floor(moment: datetime) -> datetime:
    """The start of the period ``moment`` falls in."""
    seconds = settings.USAGE_PERIOD_SECONDS
    epoch = int(moment.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=moment.tzinfo)


def is_period_boundary(moment: datetime) -> bool:
    return moment.microsecond == 0 and int(moment.timestamp()) % settings.USAGE_PERIOD_SECONDS == 0


def rows_sql(*, where: str = "TRUE", since: str = "%(since)s", until: str = "%(until)s") -> str:
    return ROWS_SQL.format(pieces=PIECES_SQL.format(where=where, since=since, until=until))


def params(*, now: datetime, **extra) -> dict:
    return {"now": now, "period": period(), "origin": ORIGIN} | extra
