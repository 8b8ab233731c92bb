"""The Celery app. Broker is Redis (REDIS_URL / CELERY_BROKER_URL); the beat schedule lives in
settings (CELERY_BEAT_SCHEDULE) so it is code, reviewed like code."""

import os

from celery import Celery, signals

from gpucap import metrics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucap.settings")

app = Celery("gpucap")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# Failures and retries of every task, counted in Redis so every worker on every machine adds up
# (gpucap_celery_task_failures_total, gpucap_celery_task_retries_total on /metrics).
@signals.task_failure.connect
def _count_task_failure(sender=None, **_) -> None:
    metrics.shared_count(metrics.CELERY_TASK_FAILURES, task=_task_name(sender))


@signals.task_retry.connect
def _count_task_retry(sender=None, reason=None, **_) -> None:
    # A retry for an error, not a task looking again later (a driver task polling a booting
    # VM retries with a countdown and no error): those are its work, not trouble.
    if getattr(reason, "exc", reason) is not None:
        metrics.shared_count(metrics.CELERY_TASK_RETRIES, task=_task_name(sender))


def _task_name(task) -> str:
    return getattr(task, "name", None) or "unknown"
