"""Each deployment's load, minute by minute, kept from the router's own counters (issue 21): the
history a recorded load profile is made from (gpucap/inference/load_profile.py).

The router counts, per deployment and epoch second, the requests it sent to a replica
(``cache.requests_key``), and Redis forgets each count ``REQUESTS_TTL_SECONDS`` later.
``inference.load_record`` runs every minute and writes a `LoadMinute` for every closed minute
of every deployment that Redis still holds:

- One pipelined round trip per batch of deployments reads every second still surely held (the
  last ``REQUESTS_TTL_SECONDS`` less a margin) and each deployment's requests in flight.
- A minute is closed ``CLOSED_AFTER_SECONDS`` after it ends, so a request the router stamped
  with its last second has been counted.
- A run that came late finds the first seconds of a minute gone: the row says how many
  seconds it covers (``seconds``), and a minute wholly gone has no row. A gap stays a gap,
  never a zero; a minute with no request that the recorder saw is a zero row. A minute is
  read whole by a run 62 to 118 s after it began; a beat that ticks within 2 s of the minute's
  turn reads each minute a few seconds short (the row says so, and its rate is requests over
  the seconds seen).
- Rows are inserted with ``ignore_conflicts`` on (deployment, minute): a second run, a retry
  or two workers at once write nothing twice, and the first (fullest) reading of a minute wins.

Service time. The simulator needs each deployment's mean time a request holds a replica slot
(``service_seconds``). Rather than add a command to the router's release step (every request
would pay for it; see bench/router_overhead.py), the recorder samples the requests in flight
(the router's ``inflight`` hash, read in the same round trip) when it records a minute, and
keeps the sample on the newest minute it wrote. By Little's law the mean in flight is
throughput times mean service time, so over a window ``service = mean(in flight sampled) /
mean(requests per second of the sampled minutes)``. One sample a minute is noisy, but the beat's
moments are independent of the traffic, so over hours the mean is sound; a whole day gives
1,440 samples.

Retention: minutes older than ``LOAD_HISTORY_DAYS`` are deleted by the same task.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings

from gpucap.inference import cache
from gpucap.inference.models import InferenceDeployment, LoadMinute

CLOSED_AFTER_SECONDS = 2  # a second's count is final this long after it ends
HELD_MARGIN_SECONDS = 2  # seconds this close to expiring are not trusted to be there
BATCH = 50  # deployments read per Redis round trip


@dataclass(frozen=True)
class Recorded:
    """What one run of the recorder did (for the worker's log)."""

    minutes: int  # rows offered (a minute already kept is not written again)
    deployments: int
    pruned: int

    def as_dict(self) -> dict[str, int]:
        return {"minutes": self.minutes, "deployments": self.deployments, "pruned": self.pruned}


def load_record(*, now: datetime) -> Recorded:
    """Keep every closed minute the router's counters still hold, then prune old minutes."""
    written, deployments = load_minutes_record(now=now)
    pruned = load_minutes_prune(now=now)
    return Recorded(minutes=written, deployments=deployments, pruned=pruned)


def load_minutes_record(*, now: datetime) -> tuple[int, int]:
    """Write the closed minutes Redis still holds, for every deployment. Returns (rows
    offered, deployments read)."""
    first, end = _window(now)
    if end <= first:
        return 0, 0
    deployments = list(
        InferenceDeployment.objects.order_by("pk").values_list("pk", "slug", "created_at")
    )
    written = 0
    for start in range(0, len(deployments), BATCH):
        batch = deployments[start : start + BATCH]
        rows = _read_batch(batch, first, end)
        LoadMinute.objects.bulk_create(rows, ignore_conflicts=True)
        written += len(rows)
    return written, len(deployments)


def load_minutes_prune(*, now: datetime) -> int:
    """Delete minutes older than ``LOAD_HISTORY_DAYS``. Returns how many."""
    before = now - timedelta(days=settings.LOAD_HISTORY_DAYS)
    deleted, _ = LoadMinute.objects.filter(minute__lt=before).delete()
    return deleted


def _window(now: datetime) -> tuple[int, int]:
    """The epoch seconds [first, end) to read: from the oldest second Redis surely still holds
    to the end of the last closed minute."""
    current = int(now.timestamp())
    first = current - cache.REQUESTS_TTL_SECONDS + HELD_MARGIN_SECONDS
    end = (current - CLOSED_AFTER_SECONDS) // 60 * 60
    return first, end


def _read_batch(batch: list[tuple[int, str, datetime]], first: int, end: int) -> list[LoadMinute]:
    seconds = range(first, end)
    pipe = cache.inference_redis().pipeline(transaction=False)
    for _, slug, _ in batch:
        pipe.mget([cache.requests_key(slug, second) for second in seconds])
        pipe.hgetall(cache.inflight_key(slug))
    replies = pipe.execute()
    rows = []
    newest = end - 60  # the in-flight sample goes with the minute that just closed
    for (pk, _, created_at), counts, inflight in zip(
        batch, replies[0::2], replies[1::2], strict=True
    ):
        in_flight = sum(max(int(value), 0) for value in inflight.values())
        per_minute: dict[int, list[int]] = {}
        for second, count in zip(seconds, counts, strict=True):
            minute = per_minute.setdefault(second // 60 * 60, [0, 0])
            minute[0] += max(int(count), 0) if count is not None else 0
            minute[1] += 1
        for minute, (requests, covered) in sorted(per_minute.items()):
            if minute + 60 <= created_at.timestamp():
                continue  # the deployment did not exist yet
            rows.append(
                LoadMinute(
                    deployment_id=pk,
                    minute=datetime.fromtimestamp(minute, tz=UTC),
                    requests=requests,
                    seconds=covered,
                    in_flight_sampled=in_flight if minute == newest else None,
                )
            )
    return rows
