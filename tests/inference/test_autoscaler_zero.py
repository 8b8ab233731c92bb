"""Inference from zero (#17), on the autoscaler's side: a deployment with ``min_replicas`` 0
wakes when the router queues a request (``inference.wake``, sent by the router, run here by a
real worker outside a set and by the task itself inside one, where the replica is demand the
arbiter plans and, in enforcement, places), and goes back to zero after its cool-down.

The load is set in Redis exactly where the router keeps it (tests/inference/test_cold_start.py
has the router queueing it); time moves through ``now=``."""

import pytest
from django.conf import settings

from gpucap.celery import app
from gpucap.inference import tasks
from gpucap.inference.autoscaler import Scaling
from gpucap.plans import services as plans
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals.models import Allocation, VirtualMachine
from tests.inference import test_autoscaler as autoscaler_tests
from tests.inference.test_autoscaler import autoscale, live, router_load, tick, vms_of
from tests.rentals.conftest import wait_for

State = VirtualMachine.State
Kind = PlanAction.Kind

clock = autoscaler_tests.clock
celery_queue = autoscaler_tests.celery_queue
sent_tasks = autoscaler_tests.sent_tasks
sim = autoscaler_tests.sim
workers = autoscaler_tests.workers


def test_a_deployment_with_min_replicas_0_goes_back_to_zero_after_its_cooldown(deploy, clock):
    chat = deploy(min_replicas=0, max_replicas=2, scale_down_cooldown_seconds=120)
    assert live(chat) == 0

    router_load(chat, queued=1)  # one request waiting for a replica to start
    up = autoscale(chat, clock(0))
    assert (up.action, up.before, up.after) == (Scaling.UP, 0, 1)

    router_load(chat, in_flight={up.vms[0]: 1})  # being answered: the replica stays
    assert autoscale(chat, clock(60)).action == Scaling.STEADY
    router_load(chat)  # quiet
    for seconds in (61, 150, 180):
        assert autoscale(chat, clock(seconds)).action == Scaling.COOLING
    assert live(chat) == 1

    down = autoscale(chat, clock(181))  # 120 s of quiet since 61
    assert (down.action, down.before, down.after, down.desired) == (Scaling.DOWN, 1, 0, 0)
    assert live(chat) == 0
    assert [vm.state for vm in vms_of(down)] == [State.TERMINATED]
    for seconds in (200, 10_000):  # however long it stays quiet, it stays at zero
        assert autoscale(chat, clock(seconds)).action == Scaling.STEADY
    assert live(chat) == 0

    router_load(chat, queued=3)  # and wakes again
    assert autoscale(chat, clock(10_001)).after == 1


@pytest.mark.django_db(transaction=True)
def test_a_wake_up_makes_the_worker_start_a_replica_of_a_deployment_at_zero(
    workers, sim, deploy, fleet_east
):
    cluster = fleet_east["cluster"]
    cluster.driver_settings = {"boot_seconds": 0.2}
    cluster.save(update_fields=["driver_settings"])
    chat = deploy(min_replicas=0, max_replicas=3, target_in_flight=4)
    worker = workers(INFERENCE_REDIS_URL=settings.INFERENCE_REDIS_URL)
    assert chat.replicas.count() == 0

    router_load(chat, queued=2)  # what the router counts, then sends:
    app.send_task("inference.wake", args=[chat.slug])

    def running():
        return chat.replicas.filter(state=State.RUNNING).first()

    replica = wait_for(running, timeout=30, what="a running replica", log=worker.log)
    assert chat.replicas.count() == 1  # two requests are one replica's worth (target 4)
    assert sim.status(replica.instance_id, "a100-001").state == "running"
    assert Allocation.objects.filter(vm=replica, released_at=None).count() == 1


def test_inside_a_set_a_wake_up_is_a_demand_the_arbiter_plans_and_in_enforcement_places(
    deploy, fleet_east, operator, sent_tasks
):
    h100 = fleet_east["sets"]["h100-east"]
    chat = deploy(where="set", min_replicas=0, max_replicas=2, gpus_per_replica=4)
    assert chat.replicas.count() == 0
    router_load(chat, queued=1)

    assert tasks.wake(chat.slug).startswith(f"{chat.slug}: up 0->1 replicas")

    (replica,) = chat.replicas.all()
    assert replica.state == State.PENDING and replica.demand_group
    plan = tick(fleet_east)  # dry run: the plan names the demand, waiting for Approve
    assert plan.status == Plan.Status.PROPOSED and plan.complete
    (placement,) = plan.actions.filter(kind=Kind.PLACEMENT, vm=replica)
    assert placement.group == replica.demand_group and len(placement.gpus) == 4
    replica.refresh_from_db()
    assert replica.state == State.PENDING

    plans.capacity_set_set_mode(capacity_set=h100, mode="enforce", actor=operator)
    enforced = tick(fleet_east)

    assert enforced.status == Plan.Status.APPLIED
    replica.refresh_from_db()
    assert replica.state != State.PENDING and replica.node is not None
    assert Allocation.objects.filter(vm=replica, released_at=None).count() == 4
