"""Celery tasks of inference, all on beat; each calls one function and is harmless to run twice
at once or to miss once (the next run catches up).

- ``inference.autoscale`` (every ``INFERENCE_AUTOSCALE_SECONDS``): replicas follow the queue
  (`gpucap.inference.autoscaler`);
- ``inference.probe`` (every ``INFERENCE_PROBE_SECONDS``): each running replica's readiness
  probe; the router sends requests only to replicas whose probe answered
  (`gpucap.inference.probe`);
- ``inference.resync`` (every minute): the router's route and key documents rebuilt from the
  database, so a lost publish heals;
- ``inference.keys_flush`` (every minute): the router's last-used times copied to the keys.
"""

from celery import shared_task

from gpucap.inference import autoscaler, cache, probe, services


@shared_task(name="inference.autoscale")
def autoscale() -> dict[str, str]:
    """Returns what changed, per deployment slug (for the worker's log)."""
    return {
        scaling.deployment: str(scaling)
        for scaling in autoscaler.deployments_autoscale()
        if scaling.action in (autoscaler.Scaling.UP, autoscaler.Scaling.DOWN)
    }


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
