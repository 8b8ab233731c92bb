"""Celery tasks of the planning loop: ids in, call a service. Each is idempotent.

- ``plans.replan``: a debounced tick of one set after a change (`gpucap.plans.triggers`);
- ``plans.tick_all`` (beat, every ``PLANS_INTERVAL_SECONDS``): a tick of every set, so plans
  stay current and approved placements complete even if a message is lost;
- ``plans.prune`` (beat, hourly): bounded plan history;
- ``plans.simulate``: carry out one stored simulation run (`gpucap.plans.simulation_runs`); a
  run another claim is carrying out is looked at again once that claim could have gone stale;
- ``plans.simulations_recover`` (beat, every minute): runs whose worker or message was lost;
- ``rentals.standalone_place``: placement outside capacity sets (`gpucap.plans.standalone`),
  sent by the rentals services and the reconciler. Its name is older than its home and stays:
  a task's name is what queued messages carry, and a renamed task would strand them during a
  rolling upgrade.

Two ticks of one set wait for each other on the set's advisory lock. A tick that fails — it
lost a PostgreSQL deadlock (a VM transition locking the same rows the other way round), met a
restarting database, or anything else — is retried, a bounded number of times
(``PLANS_TICK_RETRIES``) with exponential backoff; the periodic tick covers the set after that.
"""

import logging

from celery import shared_task
from celery.exceptions import Retry
from celery.utils.time import get_exponential_backoff_interval
from django.conf import settings
from django.db import OperationalError

from gpucap.fleet.models import CapacitySet
from gpucap.plans import services, simulation_runs, standalone
from gpucap.plans.models import Plan
from gpucap.plans.triggers import replan_release

logger = logging.getLogger(__name__)


@shared_task(name="plans.replan", bind=True, max_retries=settings.PLANS_TICK_RETRIES)
def replan(self, capacity_set_id: int) -> int | None:
    replan_release(capacity_set_id)
    return _tick(self, capacity_set_id, Plan.Trigger.CHANGE)


@shared_task(name="plans.tick", bind=True, max_retries=settings.PLANS_TICK_RETRIES)
def tick(self, capacity_set_id: int) -> int | None:
    return _tick(self, capacity_set_id, Plan.Trigger.PERIODIC)


@shared_task(name="plans.tick_all")
def tick_all() -> int:
    """Send one tick per set (each set's tick runs on its own, in parallel across workers)."""
    ids = list(CapacitySet.objects.values_list("pk", flat=True))
    for capacity_set_id in ids:
        tick.delay(capacity_set_id)
    return len(ids)


@shared_task(name="plans.prune")
def prune() -> int:
    return services.plans_prune()


def _tick(task, capacity_set_id: int, trigger: str) -> int | None:
    try:
        result = services.capacity_set_tick(capacity_set_id=capacity_set_id, trigger=trigger)
    except Retry:
        raise
    except Exception as exc:  # a deadlock lost, a database restarting, a bug met by chance
        countdown = get_exponential_backoff_interval(
            factor=1, retries=task.request.retries, maximum=60, full_jitter=True
        )
        logger.warning(
            "tick of capacity set %s failed (%r); retry %s of %s in %s s",
            capacity_set_id,
            exc,
            task.request.retries + 1,
            task.max_retries,
            countdown,
            exc_info=not isinstance(exc, OperationalError),
        )
        raise task.retry(exc=exc, countdown=countdown) from exc
    return result.plan.pk if result.plan is not None else None


@shared_task(name="plans.simulate", bind=True, max_retries=settings.SIMULATION_MAX_ATTEMPTS)
def simulate(self, run_id: int) -> str:
    outcome = simulation_runs.simulation_carry_out(run_id=run_id)
    if outcome == simulation_runs.Outcome.BUSY:
        # Running under another claim (or this message delivered again after its worker died):
        # come back when that claim, if lost, may be taken over.
        raise self.retry(countdown=settings.SIMULATION_STALE_SECONDS + 1)
    return outcome.value


@shared_task(name="plans.simulations_recover")
def simulations_recover() -> int:
    return simulation_runs.simulations_recover()


@shared_task(name="rentals.standalone_place")
def standalone_place(cluster_id: int) -> None:
    """Place the pending VMs of a cluster's standalone pools on free capacity."""
    standalone.standalone_place(cluster_id=cluster_id)
