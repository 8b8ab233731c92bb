"""The load recorder (``inference.load_record``, gpucap/inference/load_history.py): the router's
per-second request counters, which Redis forgets after two minutes, kept by the minute.

The first test drives the real router (tests/inference/test_router.py's server); the others
write the counters as the router's acquire script does (INCR, and EXPIRE on the first), for
seconds of a minute chosen ahead of the clock, and run the recorder with the ``now`` they
mean (the recorder reads only the seconds Redis still surely holds at that ``now``)."""

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from gpucap.inference import cache, load_history
from gpucap.inference.models import InferenceDeployment, LoadMinute
from gpucap.inference.tasks import load_record
from tests.inference import test_router as live

# The live router's fixtures (its autouse Redis fixture too: these tests share its database).
inference_redis = live.inference_redis
server, sim, serving, key = live.server, live.sim, live.serving, live.key


def count(client, slug: str, second: int, requests: int) -> None:
    """What the router's acquire script does for each request it sends to a replica."""
    name = cache.requests_key(slug, second)
    for _ in range(requests):
        if client.incr(name) == 1:
            client.expire(name, cache.REQUESTS_TTL_SECONDS)


def at(second: int) -> datetime:
    return datetime.fromtimestamp(second, tz=UTC)


def minutes(deployment) -> dict[datetime, tuple[int, int, int | None]]:
    return {
        row.minute: (row.requests, row.seconds, row.in_flight_sampled)
        for row in LoadMinute.objects.filter(deployment=deployment)
    }


@pytest.fixture
def ahead(deploy):
    """A deployment, and a minute start 10 minutes ahead of the clock (after its creation)."""
    return deploy("chat"), (int(time.time()) // 60 + 10) * 60


@pytest.mark.django_db
def test_the_minutes_of_requests_the_router_sent_are_kept(server, serving, key):
    deployment = serving(replicas=1)
    secret = key(deployment)
    sent = []
    for _ in range(3):
        sent.append(int(time.time()))
        assert live.chat(server, deployment, secret).status_code == 200
    live.settled(deployment)

    # Once the last request's minute has closed (and before Redis forgets it).
    last = sent[-1] // 60 * 60
    result = load_history.load_record(now=at(last + 62))

    kept = minutes(deployment)
    assert result.deployments == 1
    assert sum(requests for requests, _, _ in kept.values()) == 3
    assert kept[at(last)][0] >= 1
    assert kept[at(last)][1:] == (60, 0)  # seen whole; nothing was in flight when it was read


@pytest.mark.django_db
def test_a_quiet_minute_is_a_zero_row_and_a_second_run_writes_nothing_twice(ahead, inference_redis):
    deployment, minute = ahead
    count(inference_redis, deployment.slug, minute + 5, 4)
    count(inference_redis, deployment.slug, minute + 59, 2)

    load_history.load_record(now=at(minute + 70))
    first = minutes(deployment)
    assert first == {
        # Redis surely holds the last 118 s only: the minute before is seen in part, quiet.
        at(minute - 60): (0, 48, None),
        # The minute that just closed, whole, with the requests in flight then (none).
        at(minute): (6, 60, 0),
    }

    count(inference_redis, deployment.slug, minute + 30, 100)  # too late: not read again
    load_history.load_record(now=at(minute + 70))
    load_history.load_record(now=at(minute + 80))
    assert minutes(deployment) == first

    load_history.load_record(now=at(minute + 125))  # the next minute, quiet, has closed
    assert minutes(deployment)[at(minute + 60)] == (0, 60, 0)  # a zero, not a gap
    assert LoadMinute.objects.filter(deployment=deployment).count() == 3


@pytest.mark.django_db
def test_a_late_run_keeps_what_redis_still_held_and_leaves_a_gap_for_the_rest(
    ahead, inference_redis
):
    deployment, minute = ahead
    for second in range(minute - 60, minute + 60, 10):  # a request every 10 s, two minutes
        count(inference_redis, deployment.slug, second, 1)

    # The beat ran 100 s after `minute` ended: Redis surely holds the seconds from
    # minute + 42 on (the counters live 120 s, less a 2 s margin), so the minute before is
    # gone (a gap: no row, not a zero) and `minute` is kept for its last 18 s: 1 request.
    load_history.load_record(now=at(minute + 160))

    assert minutes(deployment) == {at(minute): (1, 18, None), at(minute + 60): (0, 60, 0)}


@pytest.mark.django_db
def test_a_minute_before_the_deployment_existed_is_not_recorded(deploy, inference_redis):
    deployment = deploy("chat")
    created = int(deployment.created_at.timestamp())
    load_history.load_record(now=at(created // 60 * 60 + 62))
    assert set(minutes(deployment)) == {at(created // 60 * 60)}


@pytest.mark.django_db
def test_minutes_older_than_the_history_keeps_are_pruned(ahead, settings):
    deployment, minute = ahead
    settings.LOAD_HISTORY_DAYS = 2
    now = at(minute)
    for age in (timedelta(days=2, minutes=1), timedelta(days=1, hours=23)):
        LoadMinute.objects.create(deployment=deployment, minute=now - age, requests=1)

    assert load_history.load_minutes_prune(now=now) == 1
    assert list(LoadMinute.objects.values_list("minute", flat=True)) == [
        now - timedelta(days=1, hours=23)
    ]


@pytest.mark.django_db
def test_the_beat_task_records_the_minute_that_just_closed(deploy, inference_redis):
    deployment = deploy("chat")
    an_hour_ago = timezone.now() - timedelta(hours=1)
    InferenceDeployment.objects.filter(pk=deployment.pk).update(created_at=an_hour_ago)
    just_closed = (int(timezone.now().timestamp()) - load_history.CLOSED_AFTER_SECONDS) // 60 - 1
    count(inference_redis, deployment.slug, just_closed * 60 + 1, 3)
    result = load_record()
    assert result["deployments"] == 1
    assert minutes(deployment)[at(just_closed * 60)][:2] == (3, 60)


def test_the_task_is_on_beat_every_minute(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["inference-load-record"]
    assert entry["task"] == "inference.load_record" and entry["schedule"] == 60.0
