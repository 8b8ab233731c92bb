"""Prometheus metrics that gpucap's processes count as they serve requests.

Counts of things in the database (GPUs, notices, VMs) are read when /metrics is scraped
(gpucap.observability); what is defined here is counted as it happens: requests and their
latencies, per serving process (prometheus_client's multiprocess mode adds up the web workers:
PROMETHEUS_MULTIPROC_DIR), and events every process counts into Redis (shared counters below).
"""

import json
import logging
from dataclasses import dataclass

import redis
from django.db import connection, transaction
from prometheus_client import Counter, Histogram

from gpucap.redis_clients import shared_redis

logger = logging.getLogger(__name__)

# Latencies of requests answered in-process: sub-millisecond to a slow upstream.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

ROUTER_REQUESTS = Counter(
    "gpucap_router_requests",
    "Requests the inference router answered, by deployment and HTTP status.",
    ["deployment", "code"],
)
ROUTER_LATENCY = Histogram(
    "gpucap_router_request_duration_seconds",
    "Time from a request reaching the inference router to the last byte of its answer.",
    ["deployment"],
    buckets=LATENCY_BUCKETS,
)
METADATA_REQUESTS = Counter(
    "gpucap_metadata_requests",
    "Requests the instance metadata endpoint answered, by flavour (ec2, gcp, azure, native) "
    "and HTTP status.",
    ["flavour", "code"],
)
METADATA_LATENCY = Histogram(
    "gpucap_metadata_request_duration_seconds",
    "Time the instance metadata endpoint took to answer.",
    ["flavour"],
    buckets=LATENCY_BUCKETS,
)


# --- counters every process adds to, kept in Redis -----------------------------------------------
#
# Plans made and applied, and Celery task failures, happen in web processes and in workers on
# any machine, and the plans they count are pruned from the database (plans_prune): their counts
# live in one Redis hash per counter (field: the JSON list of label values), incremented with
# HINCRBY, so they add up across processes and never go backwards. /metrics reads them all in one
# round trip (gpucap.observability).


@dataclass(frozen=True)
class SharedCounter:
    name: str  # exposed as <name>_total
    documentation: str
    labelnames: tuple[str, ...]


PLANS_MADE = SharedCounter(
    "gpucap_plans_made",
    "Plans the arbiter made, by capacity set and the set's mode at the time.",
    ("set", "mode"),
)
PLANS_FOLDED = SharedCounter(
    "gpucap_plans_folded",
    "Replans that found the set's latest plan again with nothing to do, folded into it instead "
    "of being stored, by capacity set.",
    ("set",),
)
PLANS_APPLIED = SharedCounter(
    "gpucap_plans_applied",
    "Plans applied, by capacity set and mode (dry_run: approved by an operator; enforce: "
    "applied as made).",
    ("set", "mode"),
)
CELERY_TASK_FAILURES = SharedCounter(
    "gpucap_celery_task_failures",
    "Celery tasks that ended in an exception, by task name.",
    ("task",),
)
CELERY_TASK_RETRIES = SharedCounter(
    "gpucap_celery_task_retries",
    "Celery task retries asked for, by task name.",
    ("task",),
)
ON_COMMIT_FAILURES = SharedCounter(
    "gpucap_on_commit_failures",
    "Post-commit hooks that raised (a task the broker refused, a cache publish, a mail), by "
    "hook; the other hooks of the transaction ran on (gpucap.tasks.on_commit).",
    ("hook",),
)
SHARED_COUNTERS = (
    PLANS_MADE,
    PLANS_FOLDED,
    PLANS_APPLIED,
    CELERY_TASK_FAILURES,
    CELERY_TASK_RETRIES,
    ON_COMMIT_FAILURES,
)


def shared_count(counter: SharedCounter, /, **labels: str) -> None:
    """Add one to ``counter`` for ``labels``. Never raises: a count lost while Redis is down
    must not fail the plan or task it counts."""
    field = json.dumps([str(labels[name]) for name in counter.labelnames])
    try:
        shared_counters_redis().hincrby(shared_counter_key(counter), field, 1)
    except redis.RedisError:
        logger.warning("metrics: %s%s not counted: Redis unavailable", counter.name, labels)


def shared_count_on_commit(counter: SharedCounter, /, **labels: str) -> None:
    """Count once the current transaction commits (not at all if it rolls back)."""
    transaction.on_commit(lambda: shared_count(counter, **labels), robust=True)


def shared_counts() -> dict[SharedCounter, dict[tuple[str, ...], int]]:
    """Every shared counter's values by label values, in one Redis round trip."""
    pipe = shared_counters_redis().pipeline(transaction=False)
    for counter in SHARED_COUNTERS:
        pipe.hgetall(shared_counter_key(counter))
    return {
        counter: {tuple(json.loads(field)): int(value) for field, value in reply.items()}
        for counter, reply in zip(SHARED_COUNTERS, pipe.execute(), strict=True)
    }


def shared_counter_key(counter: SharedCounter) -> str:
    # Under the database's name, as gpucap.plans.triggers keys are: test runs sharing one Redis
    # (one database each) keep apart, and a deployment's counts belong with its database.
    return f"gpucap:metrics:{connection.settings_dict['NAME']}:{counter.name}"


def shared_counters_redis() -> redis.Redis:
    return shared_redis()
