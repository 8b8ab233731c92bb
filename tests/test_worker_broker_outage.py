"""A Celery worker rides out an outage of its broker: a real worker (tests/rentals/conftest.py)
on a Redis of the test's own (tests/redis_server.py), which is killed with messages held by
the worker, kept down as long as the outage that once killed a worker (45 s), and started
again empty. The worker must still be running and consume what is sent after."""

import time
from pathlib import Path

import redis
import yaml

from gpucap.celery import app
from gpucap.notices import cache
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.conftest import wait_for

celery_queue = rentals_fixtures.celery_queue
workers = rentals_fixtures.workers

OUTAGE_SECONDS = 45
ROOT = Path(__file__).resolve().parents[1]


def test_a_worker_keeps_consuming_after_its_broker_was_down_and_came_back_empty(
    workers, own_redis, celery_queue
):
    broker, store = own_redis.url(0), own_redis.url(1)
    worker = workers(CELERY_BROKER_URL=broker, METADATA_REDIS_URL=store)

    def send(name: str, **options) -> None:
        with app.connection_for_write(broker) as connection:
            app.send_task(name, connection=connection, queue=celery_queue, **options)

    def resynced() -> bool:
        client = redis.Redis.from_url(store)
        try:
            return bool(client.exists(cache.SYNCED_KEY))
        except redis.ConnectionError:
            return False
        finally:
            client.close()

    send("notices.metadata_resync")
    wait_for(resynced, timeout=60, what="the worker to consume a task", log=worker.log)
    # Held by the worker, unacknowledged, when the broker goes: restored on the connection loss.
    for _ in range(3):
        send("notices.sweep", countdown=30)
    wait_for(
        lambda: worker.log().count("Task notices.sweep") >= 3,
        timeout=60,
        what="the worker to hold the countdown tasks",
        log=worker.log,
    )

    own_redis.stop()
    wait_for(
        lambda: "Connection to broker lost" in worker.log(),
        timeout=60,
        what="the worker to notice the outage",
        log=worker.log,
    )
    time.sleep(OUTAGE_SECONDS)  # the outage itself, not a wait for something
    own_redis.start()  # empty: nothing of before survives
    send("notices.metadata_resync")

    wait_for(resynced, timeout=120, what="the worker to consume again", log=worker.log)
    assert worker.process.poll() is None, worker.log()
    assert "AttributeError" not in worker.log()


def test_docker_compose_brings_every_service_back_when_its_process_exits():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())

    policies = {name: service.get("restart") for name, service in compose["services"].items()}

    assert set(policies) >= {"db", "redis", "web", "worker", "beat"}
    assert policies == dict.fromkeys(policies, "unless-stopped")
