"""Celery tasks of the BMC app: ids in, a service called. Each is idempotent.

- ``bmc.discover``: read the BMCs of one stored discovery and store its preview, or apply it
  if the BMCs still say what the preview showed (`gpucap.bmc.discovery_runs`). A database
  that is away is retried with backoff; a BMC that does not answer is a problem named on the
  run at once (the operator discovers again), not a retry loop.
- ``bmc.hypervisor_watch`` (beat, every ``HYPERVISOR_WATCH_SECONDS``) probes the hypervisors of
  the nodes that are not down and marks down those silent for ``NODE_DOWN_AFTER_SECONDS``
  (``gpucap.bmc.hypervisor_watch``).
- ``bmc.power_cycle`` (sent when a cycle starts) switches the node's machine off and on through
  its BMC, once per attempt however often it is delivered (``gpucap.bmc.power_cycle``).
- ``bmc.recovery_tick`` (beat, every ``RECOVERY_TICK_SECONDS``) starts automatic cycles, brings
  back nodes whose hypervisor answers after one, and fails cycles past their deadline.
"""

from celery import shared_task
from celery.utils.time import get_exponential_backoff_interval
from django.db import InterfaceError, OperationalError

from gpucap.bmc import discovery_runs
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
