"""Deadlines are kept through the faults of issue #16, injected into a live enforcing set with
real services: real Celery workers and beat (tests/rentals/conftest.py), a Redis of the test's
own carrying the broker, the metadata and the inference stores (tests/redis_server.py), and this
test's PostgreSQL database.

h100-east is full of acme's spot VMs and enforcing; globex asks for on-demand VMs one after
another, so plans apply and notices fall due with a five-second deadline, and at each deadline
one fault strikes:

(a) the worker that takes the deadline is SIGKILLed holding its stop (the VM is ``stopping``,
    no stop was sent);
(b) Redis is killed before the deadline and comes back empty after it: queued and scheduled
    tasks, metadata documents, all gone;
(c) every PostgreSQL connection of the application is terminated, again and again, across the
    deadline.

Then the fleet settles, and what users see must hold: each victim's guest was stopped by the
hypervisor within one sweep interval (and a pickup margin) of its deadline or of the service
coming back, whichever is later; the invariant audit is clean, the hypervisor and the metadata
documents included; every victim got one notice, every on-demand VM was placed once by one
applied plan and never touched.
"""

import json
import time
from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.celery import app
from gpucap.drivers.base import RUNNING
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet
from gpucap.notices.models import InterruptionNotice
from gpucap.notices.services import STOP_RESENT
from gpucap.plans import services as plans
from gpucap.plans.invariants import invariants_audit
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.conftest import wait_for
from tests.rentals.vm_helpers import request_vm

pytestmark = pytest.mark.django_db(transaction=True)

celery_queue = rentals_fixtures.celery_queue
sim = rentals_fixtures.sim
workers = rentals_fixtures.workers

State = VirtualMachine.State
KILL_AT = "notices.deadline:stopping"
SWEEP_SECONDS = 2
NOTICE_SECONDS = 5
OUTAGE_SECONDS = 15  # long enough for a worker's reconnect backoff to show
# Beyond the sweep interval, what a loaded two-core machine may take to deliver a stop: a
# worker taking the sweep, the driver's stop reaching a worker, the call landing.
PICKUP = timedelta(seconds=2)
SPOT_PLACES = [
    (node, half) for node in ("h100-001", "h100-002") for half in ([0, 1, 2, 3], [4, 5, 6, 7])
]


@pytest.fixture
def on_own_redis(own_redis, settings):
    """This process sends its tasks and writes its metadata and inference documents to the
    test's own Redis, as the workers do (the producer pools are made again for its URL)."""
    settings.METADATA_REDIS_URL = own_redis.url(1)
    settings.INFERENCE_REDIS_URL = own_redis.url(2)
    saved = app.conf.broker_url, app._pool, app.amqp._producer_pool
    app.conf.broker_url, app._pool, app.amqp._producer_pool = own_redis.url(0), None, None
    yield own_redis
    app.conf.broker_url, app._pool, app.amqp._producer_pool = saved


@pytest.fixture
def service_env(on_own_redis) -> dict[str, str]:
    """What every worker and the beat run with: the own Redis for all three stores, a fast
    sweep, planning and reconciler, and the metadata store rebuilt every few seconds."""
    return {
        "CELERY_BROKER_URL": on_own_redis.url(0),
        "METADATA_REDIS_URL": on_own_redis.url(1),
        "INFERENCE_REDIS_URL": on_own_redis.url(2),
        "NOTICES_SWEEP_SECONDS": str(SWEEP_SECONDS),
        "PLANS_DEBOUNCE_SECONDS": "1",
        "PLANS_INTERVAL_SECONDS": "2",
        "RENTALS_RECONCILE_SECONDS": "2",
        # Provisioning lost with the broker is sent again after this; longer than the resend
        # of a stop (phase a) takes, so that resend is the sweep's.
        "RENTALS_RECONCILE_GRACE_SECONDS": "8",
        "METADATA_RESYNC_SECONDS": "3",
    }


@pytest.fixture
def enforcing_set(fleet_east, other_tenant, settings):
    """h100-east enforcing with five-second notices; VMs boot in 0.3 s; globex may rent
    on-demand VMs there."""
    settings.PLANS_DEBOUNCE_SECONDS = 1
    cluster = fleet_east["cluster"]
    cluster.driver_settings = {"boot_seconds": 0.3}
    cluster.save(update_fields=["driver_settings"])
    fleet.pool_set_tenants(pool=fleet_east["pools"]["h100-ondemand"], tenants=[other_tenant])
    return fleet.capacity_set_update(
        capacity_set=fleet_east["sets"]["h100-east"], notice_seconds=NOTICE_SECONDS
    )


def state_of(vm: VirtualMachine) -> str:
    return VirtualMachine.objects.values_list("state", flat=True).get(pk=vm.pk)


def until(moment: datetime) -> None:
    """Sleep until ``moment``: when a fault strikes is the test's schedule, not a wait for
    something to happen."""
    time.sleep(max((moment - timezone.now()).total_seconds(), 0))


def terminate_application_connections() -> int:
    """pg_terminate_backend on every backend of this database but the test's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def guest_stopped_at(vm: VirtualMachine, notice: InterruptionNotice) -> datetime | None:
    """When the hypervisor had stopped ``vm`` after ``notice``: the driver's stop returns once
    the guest is off, and the VM leaves ``stopping`` (a reclaimed spot VM: for ``pending``)
    right after. None while it has not."""
    return (
        AuditEvent.objects.filter(
            object_type="virtualmachine",
            object_id=str(vm.pk),
            verb=f"vm.{State.PENDING}",
            created_at__gt=notice.issued_at,
        )
        .order_by("created_at")
        .values_list("created_at", flat=True)
        .first()
    )


def test_deadlines_are_kept_through_a_killed_worker_an_empty_redis_and_lost_connections(
    workers,
    on_own_redis,
    service_env,
    enforcing_set,
    fleet_east,
    tenant,
    other_tenant,
    operator,
    sim,
):
    # Both first workers die at the kill point: whichever takes the first deadline dies there,
    # the other sends its stop again (a lone doomed worker beside healthy ones may never be the
    # one to take it).
    doomed = [workers(**service_env, TEST_KILL_AT=KILL_AT) for _ in range(2)]
    workers(beat=True, **service_env)
    every_log = list(doomed)

    def logs() -> str:
        return "\n".join(f"--- {w.name}\n{w.log()[-6000:]}" for w in every_log)

    spot_pool, nodes = fleet_east["pools"]["h100-spot"], fleet_east["nodes"]
    spots = [
        rentals.vm_place(
            vm=request_vm(tenant, spot_pool, name=f"spot-{n}", gpu_count=4),
            node=nodes[node],
            gpu_indices=gpus,
        )
        for n, (node, gpus) in enumerate(SPOT_PLACES, start=1)
    ]
    wait_for(
        lambda: all(state_of(vm) == State.RUNNING for vm in spots),
        timeout=60,
        what="the spot VMs to boot",
        log=logs,
    )
    plans.capacity_set_set_mode(
        capacity_set=enforcing_set, mode=CapacitySet.Mode.ENFORCE, actor=operator
    )
    ondemand = fleet_east["pools"]["h100-ondemand"]
    asked: list[VirtualMachine] = []
    faults: list[tuple[InterruptionNotice, datetime]] = []  # (notice, service back at)

    def demand_arrives(name: str) -> InterruptionNotice:
        """globex asks for 4 GPUs; the enforcing set reclaims one spot VM for it."""
        asked.append(request_vm(other_tenant, ondemand, name=name, gpu_count=4))
        return wait_for(
            lambda: InterruptionNotice.objects.exclude(pk__in=[n.pk for n, _ in faults]).first(),
            timeout=60,
            what=f"a notice for {name}",
            log=logs,
        )

    # (a) The worker taking the deadline dies holding its stop; the other sends it again.
    notice = demand_arrives("train-a")
    faults.append((notice, notice.deadline))
    wait_for(
        lambda: any(w.process.poll() is not None for w in doomed),
        timeout=60,
        what="a worker to die at the deadline",
        log=logs,
    )
    (dead,) = [w for w in doomed if w.process.poll() is not None]
    assert f"kill point {KILL_AT}: SIGKILL" in dead.log(), dead.log()
    wait_for(
        lambda: guest_stopped_at(notice.vm, notice),
        timeout=60,
        what="the killed worker's stop to be sent again",
        log=logs,
    )
    assert AuditEvent.objects.filter(verb=STOP_RESENT, object_id=str(notice.vm_id)).exists()
    # The supervisor brings a worker back; the other doomed one goes the same way, untimely.
    every_log.append(workers(**service_env))
    (other,) = [w for w in doomed if w is not dead]
    other.kill()

    # (b) Redis dies before the deadline and comes back empty after it.
    notice = demand_arrives("train-b")
    until(notice.deadline - timedelta(seconds=1.5))
    on_own_redis.stop()
    time.sleep(OUTAGE_SECONDS)  # the outage itself
    on_own_redis.start()
    faults.append((notice, timezone.now()))
    victim = notice.vm
    assert sim.status(victim.instance_id, victim.node.hostname).state == RUNNING, (
        "the deadline passed in the outage: no stop could reach the hypervisor"
    )

    # (c) Every application connection to PostgreSQL is cut, again and again, across the
    #     deadline.
    notice = demand_arrives("train-c")
    until(notice.deadline - timedelta(seconds=1))
    cut_until = notice.deadline + timedelta(seconds=1.5)
    terminated = 0
    while timezone.now() < cut_until:
        terminated += terminate_application_connections()
        time.sleep(0.1)
    faults.append((notice, timezone.now()))
    assert terminated, "there were application connections to cut"

    # The fleet settles: the on-demand VMs run, their victims wait to resume.
    wait_for(
        lambda: all(state_of(vm) == State.RUNNING for vm in asked),
        timeout=90,
        what="the on-demand VMs to run",
        log=logs,
    )
    for notice, back_at in faults:
        stopped = wait_for(
            lambda notice=notice: guest_stopped_at(notice.vm, notice),
            timeout=60,
            what=f"{notice.vm.name} to stop",
            log=logs,
        )
        due = max(notice.deadline, back_at)
        assert notice.deadline <= stopped <= due + timedelta(seconds=SWEEP_SECONDS) + PICKUP, (
            f"{notice.vm.name}: deadline {notice.deadline}, service back {back_at}, "
            f"stopped {stopped}"
        )
        assert sim.status(notice.vm.instance_id, notice.vm.node.hostname).state != RUNNING

    def audit_clean():
        report = invariants_audit(hypervisor=True, metadata=True)
        return report if report.ok else None

    wait_for(audit_clean, timeout=60, what="a clean invariant audit", log=logs)
    out = StringIO()
    call_command("audit_invariants", "--json", "--hypervisor", "--metadata", stdout=out)
    assert json.loads(out.getvalue())["violations"] == []

    # Nothing doubled, nothing on-demand touched.
    victims = [notice.vm_id for notice, _ in faults]
    assert sorted(InterruptionNotice.objects.values_list("vm_id", flat=True)) == sorted(victims)
    assert not InterruptionNotice.objects.filter(vm__in=asked).exists()
    assert sorted(state_of(vm) for vm in spots) == [State.PENDING] * 3 + [State.RUNNING]
    for vm in asked:
        assert AuditEvent.objects.filter(object_id=str(vm.pk), verb="vm.provisioning").count() == 1
        placed_by = Plan.objects.filter(
            status=Plan.Status.APPLIED, actions__kind=PlanAction.Kind.PLACEMENT, actions__vm=vm
        )
        assert placed_by.count() == 1, f"{vm.name} placed by {list(placed_by)}"
