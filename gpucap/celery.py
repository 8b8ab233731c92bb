"""The Celery app. Broker is Redis (REDIS_URL / CELERY_BROKER_URL); the beat schedule lives in
settings (CELERY_BEAT_SCHEDULE) so it is code, reviewed like code."""

import functools
import os

import redis
from celery import Celery, signals
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.transport import redis as kombu_redis

from gpucap import metrics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucap.settings")


def _broker_loss_survivable() -> None:
    """Let a worker survive losing its Redis broker while it holds unacknowledged messages.

    kombu 5.7.0 (the only kombu celery 5.7.0 accepts; kombu 5.6 wants redis-py < 6.5): on the
    connection loss the consumer closes its connection, the channel restores its unacknowledged
    messages (tasks waiting for their countdown, such as a notice's deadline stop), and that
    restore builds a new Redis pool from a transport already detached from its connection:
    ``AttributeError: 'NoneType' object has no attribute 'hostname'``, which is no connection
    error, so the worker stops with "Unrecoverable error". Raised as a connection error instead,
    it is what a restore against a broker that is down meets anyway: ignored, the worker
    reconnects, and Redis redelivers the messages after the visibility timeout if it kept them.
    tests/test_worker_broker_outage.py shows it; drop this once kombu no longer needs it.
    """
    connparams = kombu_redis.Channel._connparams

    def _connparams(self, asynchronous=False):
        if self.connection.client is None:
            raise redis.ConnectionError("the broker connection is closed")
        return connparams(self, asynchronous=asynchronous)

    kombu_redis.Channel._connparams = _connparams


_broker_loss_survivable()

# How often a worker that lost its broker tries it again. kombu's default waits 2, 4, 6, ... up
# to 30 s between tries, so a worker whose Redis came back sat idle for up to 30 s more (a 45 s
# outage: reconnected at 56 s): every deadline that fell due in the outage was kept that much
# later than the notices sweep promises. Every second, for as long as it takes
# (CELERY_BROKER_CONNECTION_MAX_RETRIES is None), and a refused connection costs nothing.
BROKER_RETRY_SECONDS = 1.0


class Consumer(CeleryConsumer):
    """The worker's consumer (CELERY_WORKER_CONSUMER): Celery's, retrying a lost broker every
    ``BROKER_RETRY_SECONDS`` instead of backing off. tests/test_fault_injection.py shows a
    deadline due in a Redis outage kept within one sweep interval of Redis coming back."""

    def ensure_connected(self, conn):
        conn.ensure_connection = functools.partial(
            conn.ensure_connection,
            interval_start=BROKER_RETRY_SECONDS,
            interval_step=0,
            interval_max=BROKER_RETRY_SECONDS,
        )
        return super().ensure_connected(conn)


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
