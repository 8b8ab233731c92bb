"""Celery tasks of the BMC app: ids in, a service called. Each is idempotent.

- ``bmc.discover``: read the BMCs of one stored discovery and store its preview, or apply it
  if the BMCs still say what the preview showed (`gpucap.bmc.discovery_runs`). A database
  that is away is retried with backoff; a BMC that does not answer is a problem named on the
  run at once (the operator discovers again), not a retry loop.
"""

from celery import shared_task
from celery.utils.time import get_exponential_backoff_interval
from django.db import InterfaceError, OperationalError

from gpucap.bmc import discovery_runs


@shared_task(name="bmc.discover", bind=True, max_retries=5)
def discover(self, run_id: int) -> str:
    try:
        return discovery_runs.discovery_carry_out(run_id=run_id).value
    except (OperationalError, InterfaceError) as exc:
        countdown = get_exponential_backoff_interval(
            factor=1, retries=self.request.retries, maximum=60, full_jitter=True
        )
        raise self.retry(exc=exc, countdown=countdown) from exc
