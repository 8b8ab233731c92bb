"""Celery tasks of the BMC app: ids in, a service called. Each is idempotent. Every BMC call
runs in a task, never in a web request (docs/bmc.md).

- ``bmc.discover``: read the BMCs of one stored discovery and store its preview, or apply it
  if the BMCs still say what the preview showed (`gpucap.bmc.discovery_runs`). A database
  that is away is retried with backoff; a BMC that does not answer is a problem named on the
  run at once (the operator discovers again), not a retry loop.
- ``bmc.discoveries_recover`` (beat, every ``BMC_DISCOVERY_RECOVER_SECONDS``) sends a
  discovery again when its worker or message was lost (no progress for
  ``BMC_DISCOVERY_STALE_SECONDS``), fails it after ``BMC_DISCOVERY_MAX_ATTEMPTS`` sends, and
  expires previews older than ``BMC_DISCOVERY_PREVIEW_TTL_SECONDS``
  (``gpucap.bmc.discovery_upkeep``).
- ``bmc.hypervisor_watch`` (beat, every ``HYPERVISOR_WATCH_SECONDS``) probes the hypervisors of
  the nodes that are not down and marks down those silent for ``NODE_DOWN_AFTER_SECONDS``
  (``gpucap.bmc.hypervisor_watch``).
- ``bmc.power_cycle`` (sent when a cycle starts) switches the node's machine off and on through
  its BMC, once per attempt however often it is delivered (``gpucap.bmc.power_cycle``).
- ``bmc.recovery_tick`` (beat, every ``RECOVERY_TICK_SECONDS``) starts automatic cycles, brings
  back nodes whose hypervisor answers after one, and fails cycles past their deadline.
- ``bmc.provision_step`` takes one provisioning run as far as it goes now
  (`gpucap.bmc.provisioning`); the first is sent when the run is started, and
  ``bmc.provisionings_tick`` (on beat, every ``PROVISION_POLL_SECONDS``) sends one for each run
  in progress: the waiting ones ask their hypervisor, and a run whose step was lost (a dead
  worker, a message the broker dropped) goes on. Steps of one run are serialised by a
  PostgreSQL session advisory lock, released even when its worker is killed; a step that finds
  the lock taken leaves the run to the step holding it.
"""

import dataclasses

from celery import shared_task
from celery.utils.time import get_exponential_backoff_interval
from django.conf import settings
from django.db import InterfaceError, OperationalError

from gpucap import locks
from gpucap.bmc import discovery_runs, provisioning
from gpucap.bmc import discovery_upkeep as upkeep
from gpucap.bmc import power_cycle as cycles
from gpucap.bmc.hypervisor_watch import hypervisor_watch as watch


@shared_task(name="bmc.discover", bind=True, max_retries=5)
def discover(self, run_id: int) -> str:
    try:
        return discovery_runs.discovery_carry_out(run_id=run_id).value
    except (OperationalError, InterfaceError) as exc:
        countdown = get_exponential_backoff_interval(
            factor=1, retries=self.request.retries, maximum=60, full_jitter=True
        )
        raise self.retry(exc=exc, countdown=countdown) from exc


@shared_task(name="bmc.discoveries_recover")
def discoveries_recover() -> dict:
    """Returns the runs sent again and failed, and how many previews expired."""
    return dataclasses.asdict(upkeep.discoveries_recover())


@shared_task(name="bmc.hypervisor_watch")
def hypervisor_watch() -> int:
    """Returns how many nodes it marked down."""
    return len(watch())


@shared_task(name="bmc.power_cycle")
def power_cycle(attempt_id: int) -> bool:
    """Returns whether the machine was switched back on (False: a repeated delivery, or the
    cycle failed, which its attempt records)."""
    return cycles.power_cycle_carry_out(attempt_id=attempt_id)


@shared_task(name="bmc.recovery_tick")
def recovery_tick() -> dict[str, list[int]]:
    return cycles.recovery_tick()


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
    with locks.session_try_lock(locks.PROVISIONING, provisioning_id) as taken:
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
