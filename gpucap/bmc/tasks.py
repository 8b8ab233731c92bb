"""Celery tasks that speak to BMCs: every BMC call runs in a task, never in a web request
(docs/bmc.md). Thin: ids in, a service of ``gpucap.bmc`` called.

``bmc.provision_step`` takes one provisioning run as far as it goes now; the first is sent when
the run is started, and ``bmc.provisionings_tick`` (on beat, every ``PROVISION_POLL_SECONDS``)
sends one for each run in progress: the waiting ones ask their hypervisor, and a run whose step
was lost (a dead worker, a message the broker dropped) goes on. Steps of one run are serialised
by a PostgreSQL session advisory lock, released even when its worker is killed; a step that
finds the lock taken leaves the run to the step holding it.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from celery import shared_task
from django.conf import settings
from django.db import OperationalError, connection

from gpucap import locks
from gpucap.bmc import provisioning

# A transaction that met a restarting database is run again, with backoff.
_DATABASE_RETRY = {
    "autoretry_for": (OperationalError,),
    "retry_backoff": 1,
    "retry_backoff_max": 60,
    "retry_jitter": True,
}


@shared_task(name="bmc.provision_step", max_retries=5, **_DATABASE_RETRY)
def provision_step(provisioning_id: int) -> str | None:
    """One step of a provisioning run; its state afterwards (None: another step holds it, or
    no such run)."""
    with _provisioning_lock(provisioning_id) as taken:
        if not taken:
            return None
        step = provisioning.provisioning_advance(provisioning_id)
    return step.state if step else None


@shared_task(name="bmc.provisionings_tick")
def provisionings_tick() -> int:
    """A step sent for every run in progress; how many."""
    ids = provisioning.provisionings_in_progress()
    for provisioning_id in ids:
        # Left waiting longer than a tick, a step is dropped: the next tick sends another.
        provision_step.apply_async(args=[provisioning_id], expires=settings.PROVISION_POLL_SECONDS)
    return len(ids)


@contextmanager
def _provisioning_lock(provisioning_id: int) -> Iterator[bool]:
    key = locks.key(locks.PROVISIONING, provisioning_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", key)
        taken = cursor.fetchone()[0]
    try:
        yield taken
    finally:
        if taken:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", key)
