"""Celery tasks of inference, all on beat; each calls one function and is harmless to run twice
at once or to miss once (the next run catches up).

- ``inference.autoscale`` (every ``INFERENCE_AUTOSCALE_SECONDS``): replicas follow the queue
  (`gpucap.inference.autoscaler`);
- ``inference.wake`` (sent by the router, debounced, when requests wait at zero replicas): the
  autoscaler decides that deployment at once, so a replica is asked for without waiting;
- ``inference.probe`` (every ``INFERENCE_PROBE_SECONDS``): each running replica's readiness
  probe; the router sends requests only to replicas whose probe answered
  (`gpucap.inference.probe`);
- ``inference.resync`` (every minute): the router's route and key documents rebuilt from the
  database, so a lost publish heals;
- ``inference.keys_flush`` (every minute): the router's last-used times copied to the keys;
- ``inference.load_record`` (every minute): the router's per-second request counters kept by
  the minute before Redis forgets them, and minutes past ``LOAD_HISTORY_DAYS`` pruned
  (`gpucap.inference.load_history`).
"""

from celery import shared_task
from django.utils import timezone

from gpucap.inference import autoscaler, cache, load_history, probe, services


@shared_task(name="inference.autoscale")
def autoscale() -> dict[str, str]:
    """Returns what changed, per deployment slug (for the worker's log)."""
    return {
        scaling.deployment: str(scaling)
        for scaling in autoscaler.deployments_autoscale()
        if scaling.action in (autoscaler.Scaling.UP, autoscaler.Scaling.DOWN)
    }


@shared_task(name="inference.wake")
def wake(slug: str) -> str | None:
    """Sent by the router when requests wait at zero replicas: the autoscaler decides that one
    deployment now. Returns what it did (for the worker's log)."""
    scaling = autoscaler.deployment_wake(slug=slug)
    return None if scaling is None else str(scaling)


@shared_task(name="inference.probe")
def probe_replicas() -> dict[str, int]:
    """Returns how many replicas were probed, answered, and had their probe recorded."""
    return probe.replicas_probe().as_dict()


@shared_task(name="inference.resync")
def resync() -> int:
    return cache.inference_resync()


@shared_task(name="inference.keys_flush")
def keys_flush() -> int:
    return services.api_keys_used_flush()


@shared_task(name="inference.load_record")
def load_record() -> dict[str, int]:
    """Returns how many minutes were offered (a minute kept already is not written twice), for
    how many deployments, and how many old minutes were pruned."""
    return load_history.load_record(now=timezone.now()).as_dict()
