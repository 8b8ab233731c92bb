"""The router's queue of one deployment over one step, as a fluid: requests are a continuous
flow, not counted one by one, so a step costs the same whatever the load.

Over a step of ``h`` seconds, requests arrive at ``rate`` per second. The ready replicas serve
at most ``ready * replica_concurrency / service_seconds`` per second (each slot takes one
request for ``service_seconds``). What arrives beyond that waits in the queue, up to
``queue_limit`` requests; what would go beyond is refused (the router's 429). The queue moves
in a straight line over the step, from ``queue_before`` to ``queue_after``.

Waits: a request arriving when ``q`` wait ahead of it waits ``q / capacity`` seconds. As the
queue moves linearly, the waits of the step's requests spread evenly between the waits at its
start and at its end, which gives the step's 99th percentile and how many wait longer than
the threshold. With no replica ready the requests that are queued wait for one, however long
that takes: their wait is unbounded (``wait_p99_seconds`` is None) and every one of them counts
as waiting longer than the threshold.

The autoscaler's signal at the end of the step is the router's count: requests in flight
(every slot busy while a queue stands, else the arrival rate times the service time, Little's
law) plus those queued.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

P99 = 0.99


@dataclass(frozen=True)
class QueueStep:
    """One deployment's queue over one step."""

    arrived: float  # requests that arrived
    refused: float  # turned away: the queue was full
    over_threshold: float  # waited longer than the threshold (or had no replica to wait for)
    queue_after: float  # waiting at the end of the step
    wait_p99_seconds: float | None  # None: no replica ready, the wait is unbounded
    signal: float  # in flight + queued at the end of the step (the autoscaler's input)


def queue_step(
    *,
    queue_before: float,
    rate: float,
    seconds: float,
    ready: int,
    replica_concurrency: int,
    service_seconds: float,
    queue_limit: int,
    wait_threshold_seconds: float,
) -> QueueStep:
    """The queue after ``seconds`` of arrivals at ``rate`` served by ``ready`` replicas."""
    arrived = rate * seconds
    capacity = ready * replica_concurrency / service_seconds
    unbounded = queue_before + (rate - capacity) * seconds
    queue_after = min(max(unbounded, 0.0), float(queue_limit))
    refused = max(unbounded - queue_limit, 0.0)
    accepted = arrived - refused
    if capacity == 0:
        waiting = accepted > 0 or queue_before > 0
        return QueueStep(
            arrived=arrived,
            refused=refused,
            over_threshold=accepted,
            queue_after=queue_after,
            wait_p99_seconds=None if waiting else 0.0,
            signal=queue_after,
        )
    low, high = sorted((queue_before / capacity, queue_after / capacity))
    wait_p99 = low + P99 * (high - low)
    if high <= wait_threshold_seconds:
        over = 0.0
    elif low > wait_threshold_seconds:
        over = accepted
    else:
        over = accepted * (high - wait_threshold_seconds) / (high - low)
    in_flight = (
        ready * replica_concurrency if queue_after > 0 else min(rate, capacity) * service_seconds
    )
    return QueueStep(
        arrived=arrived,
        refused=refused,
        over_threshold=over,
        queue_after=queue_after,
        wait_p99_seconds=wait_p99,
        signal=in_flight + queue_after,
    )


def replicas_wanted(signal: float, target_in_flight: int, low: int, high: int) -> int:
    """The autoscaler's rule (gpucap.inference.autoscaler.replicas_wanted): ceil(signal /
    target_in_flight), kept within the range in force. The fluid signal is rounded to whole
    requests first, as the router counts them."""
    wanted = math.ceil(max(round(signal, 6), 0) / target_in_flight)
    return max(low, min(wanted, high))
