"""The beat's ``bmc.discoveries_recover`` racing the workers it would replace, on real
PostgreSQL: a discovery it sends again while its late worker also turns up is applied once; a
round that would fail a lost run while a late worker is applying it waits for the worker's row
lock and then leaves the run applied; and the whole story through a real celery beat and two
real Celery workers (an apply whose message was lost, sent again by the beat, the late message
delivered too: one node created)."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.bmc import discovery_runs
from gpucap.bmc.discovery_runs import Outcome, discovery_carry_out
from gpucap.bmc.discovery_upkeep import discoveries_recover
from gpucap.bmc.models import DiscoveryRun
from gpucap.bmc.redfish import inventory_read
from gpucap.celery import app
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node
from tests.bmc.conftest import TEST_KEY
from tests.rentals.conftest import queue_in_flight, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "s3cret-bmc-password"


def entry(address: str) -> dict:
    return {
        "cluster": "east",
        "address": address,
        "username": "admin",
        "password": PASSWORD,
        "fabric": "nvswitch",
        "gpu_model": "H100-SXM5-80GB",
    }


@pytest.fixture
def applying(gpu_server_bmc, sent_tasks) -> DiscoveryRun:
    """A previewed discovery of the emulated GPU server an operator asked to apply; the
    message that carried the apply is in ``sent_tasks`` (not delivered)."""
    fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)
    run = discovery_runs.discovery_request(entries=[entry(gpu_server_bmc.url)])
    assert discovery_carry_out(run_id=run.pk) == Outcome.PREVIEWED
    discovery_runs.discovery_apply_request(run=run)
    return DiscoveryRun.objects.get(pk=run.pk)


class Started(threading.Thread):
    """``work`` running in a thread of its own, on its own database connection."""

    def __init__(self, work) -> None:
        super().__init__(daemon=True)
        self.work, self.result = work, None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.work()
        except Exception as error:  # reported by the caller's asserts
            self.result = error
        finally:
            connection.close()

    def outcome(self):
        self.join(timeout=120)
        assert not self.is_alive(), "the thread did not finish"
        return self.result


def stale(run: DiscoveryRun, **fields) -> None:
    DiscoveryRun.objects.filter(pk=run.pk).update(
        progress_at=timezone.now() - timedelta(days=1), **fields
    )


def node_created_once() -> None:
    assert Node.objects.filter(hostname="h100-001").count() == 1
    assert AuditEvent.objects.filter(verb="node.create").count() == 1
    assert Node.objects.get(hostname="h100-001").gpus.count() == 8


def test_a_run_sent_again_and_its_late_worker_apply_it_once(applying, sent_tasks):
    stale(applying)
    sent_tasks.clear()  # the apply's message: late, delivered below

    upkeep = discoveries_recover()

    assert upkeep.sent == [applying.pk]
    assert sent_tasks == [("bmc.discover", [applying.pk])]
    # The message sent again and the late one are carried out at once: each worker reads the
    # BMC before either applies.
    both_read = threading.Barrier(2, timeout=60)

    def read(target):
        machine = inventory_read(target)
        both_read.wait()
        return machine

    workers = [Started(lambda: discovery_carry_out(run_id=applying.pk, read=read)) for _ in "ab"]

    assert sorted(worker.outcome() for worker in workers) == [Outcome.APPLIED, Outcome.NOTHING]
    applied = DiscoveryRun.objects.get(pk=applying.pk)
    assert applied.state == "applied" and applied.passwords_sealed == []
    node_created_once()


def lock_awaited() -> bool:
    """Whether a session of the test database waits for a row lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


def test_failing_a_lost_run_waits_for_the_late_worker_applying_it_and_leaves_it_applied(
    applying, settings, monkeypatch
):
    stale(applying, sends=settings.BMC_DISCOVERY_MAX_ATTEMPTS)  # the round would fail it
    inside, go = threading.Event(), threading.Event()
    compare = discovery_runs.discovery_compare

    def compare_holding_the_run(readings, **options):
        if not options["dry_run"]:  # the apply, under the run's row lock
            inside.set()
            assert go.wait(timeout=60)
        return compare(readings, **options)

    monkeypatch.setattr(discovery_runs, "discovery_compare", compare_holding_the_run)
    worker = Started(lambda: discovery_carry_out(run_id=applying.pk))
    wait_for(inside.is_set, timeout=60, what="the late worker to hold the run")

    # To this round the worker's progress is old: it would fail the run.
    later = timezone.now() + timedelta(seconds=settings.BMC_DISCOVERY_STALE_SECONDS + 60)
    beat = Started(lambda: discoveries_recover(now=later))
    wait_for(lock_awaited, timeout=60, what="the round to wait for the run's row")
    go.set()

    assert worker.outcome() == Outcome.APPLIED
    upkeep = beat.outcome()
    assert upkeep.failed == [] and upkeep.sent == [], upkeep
    run = DiscoveryRun.objects.get(pk=applying.pk)
    assert run.state == "applied" and run.problems == []
    node_created_once()


def test_a_lost_apply_is_sent_again_by_the_beat_and_applied_once_by_real_workers(
    applying, sent_tasks, monkeypatch, workers, celery_queue
):
    env = {
        "BMC_CREDENTIAL_KEYS": TEST_KEY,
        "BMC_DISCOVERY_RECOVER_SECONDS": "1",
        "BMC_DISCOVERY_STALE_SECONDS": "30",
    }
    first, second = workers(**env), workers(**env)

    def logs() -> str:
        return first.log() + "\n--- second worker ---\n" + second.log()

    monkeypatch.undo()  # tasks go to the broker from here on; the apply's message was lost
    stale(applying)
    workers(beat=True, **env)

    wait_for(
        lambda: DiscoveryRun.objects.get(pk=applying.pk).sends == 2,
        timeout=60,
        what="the beat to send the discovery again",
        log=logs,
    )
    app.send_task("bmc.discover", args=[applying.pk])  # the lost message turns up late

    wait_for(
        lambda: DiscoveryRun.objects.get(pk=applying.pk).state == "applied",
        timeout=60,
        what="the apply",
        log=logs,
    )

    def idle() -> bool:
        messages = queue_in_flight(celery_queue).values()
        return not any(m["headers"]["task"] == "bmc.discover" for m in messages)

    wait_for(idle, timeout=30, what="the late message", log=logs)
    node_created_once()
    assert DiscoveryRun.objects.get(pk=applying.pk).problems == []
