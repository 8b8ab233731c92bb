"""The arbiter on a live fleet, end to end (issue 6, DESIGN.md section 8): a REAL Celery worker
(a ``celery worker`` subprocess) on real Redis and this test database, VMs booted and stopped
through the simulated driver, notices read over HTTP from the instance metadata endpoint.

The story: h100-east is full of acme's running spot VMs. globex asks for an 8-GPU on-demand VM
in a higher-ranked pool; the worker plans the set on its own and stores a dry-run plan naming
the spot victims, and nothing moves. An operator approves it: the victims read their notices
at the metadata endpoint, are stopped at the deadline, and the on-demand VM runs on the
partition they freed. With enforcement on, the next on-demand VM is served without a click.
"""

import json
import os
import socket
import threading
import time

import pytest
import urllib3
import uvicorn
from django.db.models import Count

from gpucap.audit.models import AuditEvent
from gpucap.celery import app
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet
from gpucap.notices import cache
from gpucap.notices.cache import utc_z
from gpucap.notices.models import InterruptionNotice
from gpucap.plans.invariants import invariants_audit
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals import services as rentals
from gpucap.rentals.models import Allocation, VirtualMachine
from tests.conftest import TEST_METADATA_REDIS_URL
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.conftest import queue_in_flight, wait_for
from tests.rentals.vm_helpers import request_vm

pytestmark = pytest.mark.django_db(transaction=True)

State = VirtualMachine.State
Kind = PlanAction.Kind
# Where acme's four 4-GPU spot VMs fill h100-east: both halves of both nodes.
SPOT_PLACES = [
    (node, half) for node in ("h100-001", "h100-002") for half in ([0, 1, 2, 3], [4, 5, 6, 7])
]
NOTICE_SECONDS = 3
METADATA_REDIS_URL = TEST_METADATA_REDIS_URL  # the test runs' metadata Redis (conftest)
PROXY = "127.0.0.1"

# The rentals fixtures: real workers on a queue of this run's own, the simulated fleet of this
# test database.
celery_queue = rentals_fixtures.celery_queue
sim = rentals_fixtures.sim
workers = rentals_fixtures.workers


# --- the fleet, the worker, the metadata endpoint ------------------------------------------------


@pytest.fixture
def h100(fleet_east, settings):
    """h100-east with a 3-second notice, VMs that boot in half a second, and globex allowed to
    rent on-demand VMs there. Changes wait one second for others before the set is planned."""
    settings.PLANS_DEBOUNCE_SECONDS = 1
    cluster = fleet_east["cluster"]
    cluster.driver_settings = {"boot_seconds": 0.5}
    cluster.save(update_fields=["driver_settings"])
    capacity_set = fleet.capacity_set_update(
        capacity_set=fleet_east["sets"]["h100-east"], notice_seconds=NOTICE_SECONDS
    )
    return capacity_set


@pytest.fixture
def worker(workers, h100, sim):
    return workers(PLANS_DEBOUNCE_SECONDS="1", METADATA_REDIS_URL=METADATA_REDIS_URL)


@pytest.fixture
def spots(worker, h100, fleet_east, tenant) -> list[VirtualMachine]:
    """Four 4-GPU spot VMs of acme filling both nodes, booted by the worker (each has the
    address the simulated hypervisor gave it)."""
    pool, nodes = fleet_east["pools"]["h100-spot"], fleet_east["nodes"]
    vms = []
    for n, (node, gpus) in enumerate(SPOT_PLACES, start=1):
        vm = request_vm(tenant, pool, name=f"spot-{n}", gpu_count=4)
        vms.append(rentals.vm_place(vm=vm, node=nodes[node], gpu_indices=gpus))
    wait_for(
        lambda: all(state_of(vm) == State.RUNNING for vm in vms),
        timeout=30,
        what="the spot VMs to boot",
        log=worker.log,
    )
    return [VirtualMachine.objects.get(pk=vm.pk) for vm in vms]


@pytest.fixture
def metadata(transactional_db, settings, monkeypatch):
    """The deployed ASGI application (gpucap.asgi) under uvicorn on a loopback port, reached
    the way guests reach it behind their node's metadata proxy: from the trusted proxy's
    address, with the guest's address in X-Forwarded-For. Keys of this pytest process only."""
    settings.METADATA_REDIS_URL = METADATA_REDIS_URL
    settings.METADATA_TRUSTED_PROXIES = [PROXY]
    prefix = f"gpucap:imds:test{os.getpid()}:ip:"
    monkeypatch.setattr(cache, "KEY_PREFIX", prefix)
    client = cache.metadata_redis()
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)
    from gpucap.asgi import application

    sock = socket.socket()
    sock.bind((PROXY, 0))
    config = uvicorn.Config(
        application, proxy_headers=False, log_level="warning", lifespan="on", timeout_keep_alive=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    pool = urllib3.HTTPConnectionPool(PROXY, sock.getsockname()[1], retries=False, timeout=10)
    yield Metadata(pool)
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)


class Metadata:
    def __init__(self, pool: urllib3.HTTPConnectionPool) -> None:
        self.pool = pool

    def serves(self, vm: VirtualMachine) -> bool:
        """Whether the endpoint knows a VM at ``vm``'s address (grants it a token)."""
        token = self.pool.request(
            "PUT",
            "/latest/api/token",
            headers={
                "X-Forwarded-For": vm.ip_address,
                "X-aws-ec2-metadata-token-ttl-seconds": "60",
            },
        )
        return token.status == 200

    def ec2(self, vm: VirtualMachine, path: str) -> urllib3.BaseHTTPResponse:
        """GET /latest/meta-data/<path> as the guest ``vm`` does with IMDSv2."""
        guest = {"X-Forwarded-For": vm.ip_address}
        token = self.pool.request(
            "PUT",
            "/latest/api/token",
            headers={**guest, "X-aws-ec2-metadata-token-ttl-seconds": "60"},
        )
        assert token.status == 200, token.data
        return self.pool.request(
            "GET",
            f"/latest/meta-data/{path}",
            headers={**guest, "X-aws-ec2-metadata-token": token.data.decode()},
        )

    @staticmethod
    def resync() -> None:
        """What beat's ``notices.metadata_resync`` does; the worker publishes its changes under
        the deployed key prefix, this endpoint reads this test process's keys."""
        cache.metadata_resync()


# --- reading the fleet the way a user sees it ----------------------------------------------------


def state_of(vm: VirtualMachine) -> str:
    return VirtualMachine.objects.values_list("state", flat=True).get(pk=vm.pk)


def live_gpus(vm: VirtualMachine) -> list[tuple[str, int]]:
    return sorted(
        Allocation.objects.filter(vm=vm, released_at=None).values_list(
            "gpu__node__hostname", "gpu__index"
        )
    )


def fleet_state() -> dict:
    """What a tenant or operator would see change: VM states, who holds which GPU, notices."""
    return {
        "vms": dict(VirtualMachine.objects.values_list("name", "state")),
        "gpus": sorted(
            Allocation.objects.filter(released_at=None).values_list(
                "vm__name", "gpu__node__hostname", "gpu__index"
            )
        ),
        "notices": InterruptionNotice.objects.count(),
    }


def gpus_held_twice() -> list:
    return list(
        Allocation.objects.filter(released_at=None)
        .values("gpu_id")
        .annotate(holders=Count("id"))
        .filter(holders__gt=1)
    )


def proposal_placing(capacity_set: CapacitySet, vm: VirtualMachine) -> Plan | None:
    """The set's current proposal, if it is up to date with the set and places ``vm``."""
    generation = CapacitySet.objects.values_list("generation", flat=True).get(pk=capacity_set.pk)
    return (
        Plan.objects.filter(
            capacity_set=capacity_set,
            status=Plan.Status.PROPOSED,
            generation=generation,
            actions__kind=Kind.PLACEMENT,
            actions__vm=vm,
        )
        .order_by("-pk")
        .first()
    )


def stopped_at(vm: VirtualMachine):
    return (
        AuditEvent.objects.filter(object_type="virtualmachine", object_id=str(vm.pk))
        .filter(verb="vm.stopping")
        .values_list("created_at", flat=True)
        .get()
    )


def idle(queue: str) -> bool:
    return not queue_in_flight(queue)


# --- the story -----------------------------------------------------------------------------------


def test_dry_run_plan_then_approve_then_enforcement_on_a_live_fleet(
    worker, h100, spots, metadata, fleet_east, other_tenant, operator_api, celery_queue
):
    ondemand = fleet_east["pools"]["h100-ondemand"]
    fleet.pool_set_tenants(pool=ondemand, tenants=[other_tenant])
    assert CapacitySet.objects.get(pk=h100.pk).mode == CapacitySet.Mode.DRY_RUN
    metadata.resync()
    for vm in spots:
        assert metadata.ec2(vm, "instance-id").data.decode() == vm.instance_id
        assert metadata.ec2(vm, "spot/instance-action").status == 404

    # 1. globex asks for 8 GPUs; the worker plans the set by itself (a debounced replan).
    train = request_vm(other_tenant, ondemand, name="train-1", gpu_count=8)
    plan = wait_for(
        lambda: proposal_placing(h100, train),
        timeout=15,
        what="a dry-run plan placing train-1",
        log=worker.log,
    )
    assert plan.mode == CapacitySet.Mode.DRY_RUN and plan.complete
    placement = plan.actions.get(kind=Kind.PLACEMENT)
    assert placement.gpus == list(range(8))
    preemptions = list(plan.actions.filter(kind=Kind.PREEMPTION).select_related("vm", "tenant"))
    victims = [action.vm for action in preemptions]
    # The victims are the two spot VMs on the node the placement takes, named with their tenant.
    assert sorted(vm.name for vm in victims) == sorted(
        vm.name for vm in spots if vm.node_id == placement.node_id
    )
    assert {(a.tenant.slug, a.pool.name, a.for_vm_id) for a in preemptions} == {
        ("acme", "h100-spot", train.pk)
    }
    spared = [vm for vm in spots if vm not in victims]

    # 2. Dry run: however often the worker ticks, nothing happens. Nobody gets a notice,
    #    every spot VM keeps running (longer than a notice would last), train-1 keeps waiting.
    before = fleet_state()
    for _ in range(5):
        app.send_task("plans.tick", args=[h100.pk])
    wait_for(lambda: idle(celery_queue), timeout=15, what="the ticks", log=worker.log)
    time.sleep(NOTICE_SECONDS + 0.5)
    assert fleet_state() == before
    assert state_of(train) == State.PENDING
    assert not InterruptionNotice.objects.exists()
    assert all(metadata.ec2(vm, "spot/instance-action").status == 404 for vm in spots)
    assert proposal_placing(h100, train) == plan, "the plan the operator reads stays current"

    # 3. Approve: the victims get notices, readable at the metadata endpoint.
    response = operator_api.post(f"/api/plans/{plan.pk}/approve/")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == Plan.Status.APPLIED
    notices = {n.vm_id: n for n in InterruptionNotice.objects.filter(plan=plan)}
    assert set(notices) == {vm.pk for vm in victims}
    for vm in victims:
        notice = notices[vm.pk]
        assert notice.reason == InterruptionNotice.Reason.ARBITER
        assert (notice.deadline - notice.issued_at).total_seconds() == NOTICE_SECONDS
        assert state_of(vm) == State.NOTIFIED
        action = metadata.ec2(vm, "spot/instance-action")
        assert action.status == 200
        assert json.loads(action.data) == {"action": "stop", "time": utc_z(notice.deadline)}
        assert metadata.ec2(vm, "spot/termination-time").data.decode() == utc_z(notice.deadline)
    for vm in spared:
        assert metadata.ec2(vm, "spot/instance-action").status == 404
        assert state_of(vm) == State.RUNNING
    assert state_of(train) == State.PENDING, "it waits for its victims"

    # 4. At the deadline the worker stops the victims (spot: back to pending, disks kept), and
    #    train-1 boots on exactly the partition the plan gave it.
    wait_for(lambda: state_of(train) == State.RUNNING, timeout=30, what="train-1", log=worker.log)
    node = placement.node.hostname
    assert live_gpus(train) == [(node, index) for index in placement.gpus]
    for vm in victims:
        notice = InterruptionNotice.objects.get(pk=notices[vm.pk].pk)
        assert notice.outcome == InterruptionNotice.Outcome.DEADLINE
        assert stopped_at(vm) >= notice.deadline, "never before the deadline"
        assert state_of(vm) == State.PENDING and live_gpus(vm) == []
    assert all(state_of(vm) == State.RUNNING for vm in spared)
    assert InterruptionNotice.objects.count() == len(victims)
    assert gpus_held_twice() == []
    metadata.resync()
    assert all(metadata.ec2(vm, "spot/instance-action").status == 404 for vm in spared)
    assert all(not metadata.serves(vm) for vm in victims), "stopped: the endpoint forgot them"
    train.refresh_from_db()
    assert metadata.ec2(train, "instance-id").data.decode() == train.instance_id

    # 5. Enforcement on: globex's next VM needs one more spot VM's GPUs, and gets them with
    #    nobody clicking anything.
    response = operator_api.post(f"/api/capacity-sets/{h100.pk}/mode/", {"mode": "enforce"})
    assert response.status_code == 200, response.json()
    assert response.json()["mode"] == CapacitySet.Mode.ENFORCE
    infer = request_vm(other_tenant, ondemand, name="infer-1", gpu_count=4)

    notice = wait_for(
        lambda: InterruptionNotice.objects.filter(completed_at=None).select_related("vm").first(),
        timeout=15,
        what="enforcement to send a notice",
        log=worker.log,
    )
    victim = notice.vm
    assert victim in spared
    assert victim.preempted_for_id == infer.pk
    metadata.resync()
    action = metadata.ec2(victim, "spot/instance-action")
    assert action.status == 200
    assert json.loads(action.data) == {"action": "stop", "time": utc_z(notice.deadline)}

    wait_for(lambda: state_of(infer) == State.RUNNING, timeout=30, what="infer-1", log=worker.log)
    victim_gpus = sorted(
        Allocation.objects.filter(vm=victim).values_list("gpu__node__hostname", "gpu__index")
    )
    assert live_gpus(infer) == victim_gpus, "infer-1 runs on the partition its victim freed"
    assert state_of(victim) == State.PENDING
    enforced = notice.plan
    assert enforced.status == Plan.Status.APPLIED and enforced.mode == CapacitySet.Mode.ENFORCE
    assert enforced.approved_by is None, "applied without an approval"
    assert list(Plan.objects.exclude(approved_by=None).values_list("pk", flat=True)) == [plan.pk]
    # One notice per victim over the whole story; nothing else was touched.
    assert InterruptionNotice.objects.count() == len(victims) + 1
    assert state_of(train) == State.RUNNING
    assert [state_of(vm) for vm in spared if vm != victim] == [State.RUNNING]
    assert gpus_held_twice() == []

    # 6. The invariant audit finds the story sound, the hypervisor and the guests' metadata
    #    documents included.
    metadata.resync()
    report = invariants_audit(hypervisor=True, metadata=True)
    assert report.ok, [f"{v.rule} {v.subject}: {v.why}" for v in report.violations]
