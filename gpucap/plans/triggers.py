"""Prompt replans, throttled per set: a change that bumps a capacity set's generation asks for
a tick of that set; a burst of changes gives one tick.

The first change claims a short-lived Redis key for the set and sends ``plans.replan``; changes
while the key is held send nothing. The task releases the key before it reads the set, so a
change committed after that read sends a new tick. Ticks of a set start at most once every
``PLANS_DEBOUNCE_SECONDS``: the task marks its start with a second key that lives that long, and
a change sends its tick with a countdown of what is left of it, so a change to a quiet set is
planned at once (an on-demand VM waiting for a reclaim gets its victims' notices without
waiting out a delay) and a burst still gives one tick per interval. If the message is lost, the
key expires and the periodic tick (``plans.tick_all``, every ``PLANS_INTERVAL_SECONDS``) plans
the set anyway.

A demand that waits only for protected VMs (a pool's ``protect_seconds``) is planned again the
moment their protection ends (`gpucap.tasks.wake_at`), without the debounce claim (a wake-up
minutes away must not hold back the prompt replans of changes meanwhile).

This module imports no app code, so the fleet services can call it without an import cycle.
"""

from django.conf import settings
from django.db import connection

from gpucap.celery import app
from gpucap.redis_clients import shared_redis
from gpucap.tasks import on_commit

# How long a claim outlives its countdown before it expires on its own (a lost message).
_CLAIM_MARGIN_SECONDS = 30


def replan_soon(capacity_set_id: int | None, *, countdown: float | None = None) -> None:
    """Ask for a tick of the set once the current transaction commits (at once outside one)."""
    if capacity_set_id is None:
        return
    on_commit(lambda: _send(capacity_set_id, countdown), what="send plans.replan")


def replan_release(capacity_set_id: int) -> None:
    """Called by the tick before it reads the set: later changes ask for a new tick, which
    starts no sooner than ``PLANS_DEBOUNCE_SECONDS`` after this one."""
    interval_ms = int(settings.PLANS_DEBOUNCE_SECONDS * 1000)
    with shared_redis().pipeline() as pipe:
        pipe.delete(_key(capacity_set_id))
        if interval_ms > 0:
            pipe.set(_started_key(capacity_set_id), "1", px=interval_ms)
        pipe.execute()


def _send(capacity_set_id: int, countdown: float | None) -> None:
    client = shared_redis()
    longest = settings.PLANS_DEBOUNCE_SECONDS if countdown is None else countdown
    claimed = client.set(
        _key(capacity_set_id), "1", nx=True, ex=int(longest) + _CLAIM_MARGIN_SECONDS
    )
    if claimed and countdown is None:
        # What is left of the interval since the set's last tick started (none: at once).
        countdown = max(client.pttl(_started_key(capacity_set_id)), 0) / 1000
    if claimed or countdown == 0:
        app.send_task("plans.replan", args=[capacity_set_id], countdown=countdown)


def _key(capacity_set_id: int) -> str:
    # The database name keeps test runs on one Redis (one database each) apart.
    return f"gpucap:plans:replan:{connection.settings_dict['NAME']}:{capacity_set_id}"


def _started_key(capacity_set_id: int) -> str:
    return f"gpucap:plans:replan-started:{connection.settings_dict['NAME']}:{capacity_set_id}"
