"""Replicas that follow the router's queue (DESIGN.md section 6, gpucap.inference.autoscaler).

Outside a capacity set (a100-inference on a100-001, 8 GPUs, one GPU per replica): a burst raises
replicas up to ``max_replicas`` and never beyond, quiet lowers them to ``min_replicas`` only after
the cool-down and never below, a burst that comes and goes makes no replicas come and go, two
runs at once add replicas once, and the replicas asked for are placed and booted by a real
worker. Inside h100-east: queue growth becomes one demand group the set's dry-run plan places
together (and the set page shows), and no preemption takes a deployment below ``min_replicas``.

The load is set in Redis exactly where the router keeps it; time moves through ``now=``.
"""

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.inference import cache, tasks
from gpucap.inference import services as inference
from gpucap.inference.autoscaler import Scaling, deployments_autoscale
from gpucap.inference.models import InferenceDeployment
from gpucap.plans import services as plans
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals import services as rentals
from gpucap.rentals.models import Allocation, VirtualMachine
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.conftest import wait_for
from tests.rentals.vm_helpers import request_vm

State = VirtualMachine.State
Kind = PlanAction.Kind

# Real workers and the simulated fleet of this test database; tasks services send, recorded.
celery_queue = rentals_fixtures.celery_queue
sent_tasks = rentals_fixtures.sent_tasks
sim = rentals_fixtures.sim
workers = rentals_fixtures.workers


# --- helpers -------------------------------------------------------------------------------------


def router_load(deployment, *, queued: int = 0, in_flight: dict[str, int] | None = None) -> None:
    """Set the counters as the router keeps them: requests queued, and in flight per replica."""
    client = cache.inference_redis()
    client.set(cache.queued_key(deployment.slug), queued)
    client.delete(cache.inflight_key(deployment.slug))
    if in_flight:
        client.hset(cache.inflight_key(deployment.slug), mapping=in_flight)


def live(deployment) -> int:
    return inference.replicas_live(deployment).count()


def scaling_of(deployment, run: list[Scaling]) -> Scaling:
    (scaling,) = [s for s in run if s.deployment == deployment.slug]
    return scaling


def autoscale(deployment, at) -> Scaling:
    return scaling_of(deployment, deployments_autoscale(now=at))


def vms_of(step: Scaling):
    """The VMs a step asked for or released (it names them by instance id, ``vm-<pk>``)."""
    pks = [int(instance_id.removeprefix("vm-")) for instance_id in step.vms]
    return VirtualMachine.objects.filter(pk__in=pks).order_by("pk")


def groups(deployment) -> list[list[str]]:
    """The replicas' demand groups in the order they were asked for, as lists of VM names."""
    found: dict[str, list[str]] = {}
    for name, group in deployment.replicas.order_by("pk").values_list("name", "demand_group"):
        found.setdefault(group, []).append(name)
    return list(found.values())


def scale_events(deployment) -> int:
    return AuditEvent.objects.filter(
        object_type="inferencedeployment", object_id=str(deployment.pk), verb="deployment.scale"
    ).count()


@pytest.fixture
def clock() -> Callable[[float], object]:
    """``clock(seconds)``: the autoscaler's now, that many seconds after the test began."""
    start = timezone.now()
    return lambda seconds: start + timedelta(seconds=seconds)


# --- outside a set: a burst, quiet, flapping ------------------------------------------------------


def test_a_burst_raises_replicas_up_to_max_replicas_and_never_beyond(deploy, clock):
    chat = deploy(min_replicas=1, max_replicas=6, target_in_flight=4)
    assert live(chat) == 1

    router_load(chat, queued=8)  # 8 waiting over a target of 4 each: 2 replicas
    step = autoscale(chat, clock(0))
    assert (step.action, step.before, step.desired, step.after) == (Scaling.UP, 1, 2, 2)
    assert live(chat) == 2

    chat_r1 = chat.replicas.order_by("pk").first()
    router_load(chat, queued=10, in_flight={chat_r1.instance_id: 4, "vm-gone": 2})  # 16: 4
    assert autoscale(chat, clock(5)).after == 4

    router_load(chat, queued=40)  # 10 wanted, 6 allowed
    step = autoscale(chat, clock(10))
    assert (step.action, step.desired, step.after) == (Scaling.UP, 6, 6)
    for seconds in (15, 20, 25):
        router_load(chat, queued=400)
        step = autoscale(chat, clock(seconds))
        assert (step.action, step.after, step.vms) == (Scaling.STEADY, 6, ())

    assert live(chat) == 6 and chat.replicas.count() == 6  # never one beyond, not even briefly
    # Each step up asked for its replicas as one group: created, then +1, +2, +2.
    assert groups(chat) == [
        ["chat-r1"],
        ["chat-r2"],
        ["chat-r3", "chat-r4"],
        ["chat-r5", "chat-r6"],
    ]
    assert scale_events(chat) == 4


def test_quiet_lowers_replicas_to_min_replicas_only_after_the_cooldown_and_never_below(
    deploy, clock
):
    chat = deploy(
        min_replicas=2, max_replicas=8, target_in_flight=4, scale_down_cooldown_seconds=300
    )
    router_load(chat, queued=40)
    assert autoscale(chat, clock(0)).after == 8

    router_load(chat)  # quiet: the counters are zero
    first_quiet = autoscale(chat, clock(10))
    assert (first_quiet.action, first_quiet.desired, first_quiet.after) == (Scaling.COOLING, 2, 8)
    for seconds in (60, 200, 309):
        assert autoscale(chat, clock(seconds)).action == Scaling.COOLING
    assert live(chat) == 8

    down = autoscale(chat, clock(310))  # 300 s after quiet was first seen
    assert (down.action, down.before, down.after, len(down.vms)) == (Scaling.DOWN, 8, 2, 6)
    assert live(chat) == 2
    assert set(vms_of(down).values_list("state", flat=True)) == {State.TERMINATED}

    for seconds in (320, 1000, 100_000):  # however long it stays quiet
        assert autoscale(chat, clock(seconds)).action == Scaling.STEADY
    assert live(chat) == 2


def test_scaling_down_keeps_what_the_remaining_load_asks_for(deploy, clock):
    chat = deploy(
        min_replicas=1, max_replicas=8, target_in_flight=4, scale_down_cooldown_seconds=60
    )
    router_load(chat, queued=32)
    assert autoscale(chat, clock(0)).after == 8

    router_load(chat, queued=9)  # still 3 replicas' worth
    assert autoscale(chat, clock(1)).action == Scaling.COOLING
    assert autoscale(chat, clock(61)).after == 3

    router_load(chat)
    assert autoscale(chat, clock(62)).action == Scaling.COOLING  # a new cool-down starts
    assert autoscale(chat, clock(121)).action == Scaling.COOLING
    assert autoscale(chat, clock(122)).after == 1


def test_a_burst_that_comes_and_goes_makes_no_replicas_come_and_go(deploy, clock):
    chat = deploy(
        min_replicas=1, max_replicas=8, target_in_flight=4, scale_down_cooldown_seconds=60
    )
    router_load(chat, queued=40)
    assert autoscale(chat, clock(0)).after == 8

    # Quiet right after the scale-up, then the burst again within the cool-down, then quiet:
    # every burst restarts the wait, so the replicas stay.
    for seconds, queued in ((1, 0), (30, 40), (31, 0), (65, 0), (80, 40), (81, 0), (140, 0)):
        router_load(chat, queued=queued)
        step = autoscale(chat, clock(seconds))
        assert step.after == 8 and step.action != Scaling.DOWN, (seconds, step)
    assert autoscale(chat, clock(141)).after == 1  # 60 s of quiet since 81
    assert scale_events(chat) == 3  # created, up, down: nothing in between


def test_no_scale_down_within_a_cooldown_of_the_last_scaling(deploy, clock):
    chat = deploy(
        min_replicas=1, max_replicas=8, target_in_flight=4, scale_down_cooldown_seconds=60
    )
    router_load(chat, queued=40)
    assert autoscale(chat, clock(100)).after == 8
    # Even with a memory of fewer having done since long before (a run that was cut short),
    # the replicas just added get a whole cool-down.
    InferenceDeployment.objects.filter(pk=chat.pk).update(scale_down_since=clock(0))
    router_load(chat)

    assert autoscale(chat, clock(101)).action == Scaling.COOLING
    assert autoscale(chat, clock(159)).action == Scaling.COOLING
    assert autoscale(chat, clock(160)).after == 1


def test_an_autoscaler_run_leaves_every_deployment_in_its_range(deploy, clock):
    busy = deploy("busy", min_replicas=1, max_replicas=3, target_in_flight=2)
    idle = deploy("idle", min_replicas=2, max_replicas=4)
    router_load(busy, queued=100)

    run = deployments_autoscale(now=clock(0))

    assert [(s.deployment, s.action, s.after) for s in run] == [
        (busy.slug, Scaling.UP, 3),
        (idle.slug, Scaling.STEADY, 2),
    ]
    assert (live(busy), live(idle)) == (3, 2)


# --- two runs at once -----------------------------------------------------------------------------


def race(calls: list[Callable[[], object]]) -> list[object]:
    """Run each call in its own thread (its own database connection), released together."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[object] = [None] * len(calls)

    def run(position: int, call: Callable[[], object]) -> None:
        try:
            barrier.wait(timeout=30)
            outcomes[position] = call()
        except Exception as exc:  # asserted below
            outcomes[position] = exc
        finally:
            connection.close()  # this thread's connection, not the test's

    threads = [threading.Thread(target=run, args=item) for item in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a run never finished"
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_two_autoscaler_runs_at_once_add_replicas_once(deploy, clock, sent_tasks):
    chat = deploy(min_replicas=1, max_replicas=8, target_in_flight=4)
    router_load(chat, queued=40)

    runs = race([lambda: deployments_autoscale(now=clock(0))] * 2)

    assert not [run for run in runs if isinstance(run, Exception)], runs
    steps = sorted((scaling_of(chat, run).action, scaling_of(chat, run).after) for run in runs)
    assert steps == [(Scaling.STEADY, 8), (Scaling.UP, 8)]
    assert chat.replicas.count() == 8 and live(chat) == 8
    assert len(groups(chat)) == 2  # created, then one step of 7
    assert scale_events(chat) == 2
    # Each new replica asked standalone placement for GPUs once it was committed.
    assert ("rentals.standalone_place", [chat.pool.cluster_id]) in sent_tasks


# --- the tasks and beat ---------------------------------------------------------------------------


def test_beat_runs_the_autoscaler_resync_and_key_flush(deploy, tenant):
    schedule = {entry["task"]: entry for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert schedule["inference.autoscale"]["schedule"] == settings.INFERENCE_AUTOSCALE_SECONDS
    assert {"inference.resync", "inference.keys_flush"} <= set(schedule)

    chat = deploy(min_replicas=1, max_replicas=4, target_in_flight=4)
    router_load(chat, queued=12)
    assert tasks.autoscale.name == "inference.autoscale"
    assert set(tasks.autoscale()) == {chat.slug}  # what it changed, for the worker's log
    assert live(chat) == 3
    assert tasks.autoscale() == {}  # a second run finds nothing to do

    api_key, _ = inference.api_key_create(tenant=tenant, name="prod", deployment=chat)
    assert tasks.resync() == 2  # one route document, one key document
    assert (
        cache.inference_redis().exists(
            cache.route_key(chat.slug), cache.api_key_key(api_key.prefix)
        )
        == 2
    )
    cache.inference_redis().set(cache.used_key(api_key.prefix), timezone.now().timestamp())
    assert tasks.keys_flush() == 1
    api_key.refresh_from_db()
    assert api_key.last_used_at is not None


# --- replicas placed and booted for real ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_replicas_a_scale_up_asks_for_are_placed_and_run_by_the_worker(
    workers, sim, deploy, fleet_east, clock
):
    cluster = fleet_east["cluster"]
    cluster.driver_settings = {"boot_seconds": 0.2}
    cluster.save(update_fields=["driver_settings"])
    worker = workers(INFERENCE_REDIS_URL=settings.INFERENCE_REDIS_URL)
    chat = deploy(min_replicas=1, max_replicas=3, target_in_flight=4)

    def running() -> int:
        return chat.replicas.filter(state=State.RUNNING).count()

    wait_for(lambda: running() == 1, timeout=20, what="the first replica", log=worker.log)
    router_load(chat, queued=12)
    step = autoscale(chat, clock(0))
    assert (step.action, step.after) == (Scaling.UP, 3)

    wait_for(lambda: running() == 3, timeout=30, what="three running replicas", log=worker.log)
    replicas = list(chat.replicas.select_related("node").order_by("pk"))
    assert {vm.node.hostname for vm in replicas} == {"a100-001"}
    for vm in replicas:
        assert sim.status(vm.instance_id, "a100-001").state == "running"
    held = list(Allocation.objects.filter(vm__in=replicas, released_at=None).values_list("gpu_id"))
    assert len(held) == len(set(held)) == 3  # one GPU each, none shared


# --- inside a capacity set ------------------------------------------------------------------------


SET_PAGE = reverse("fleet:capacity-set-detail", kwargs={"name": "h100-east"})


def tick(fleet_east) -> Plan:
    return plans.capacity_set_tick(capacity_set_id=fleet_east["sets"]["h100-east"].pk).plan


def test_queue_growth_in_a_set_is_one_demand_group_the_dry_run_plan_places_together(
    deploy, fleet_east, clock, operator
):
    chat = deploy(where="set", min_replicas=1, max_replicas=4, gpus_per_replica=4)
    router_load(chat, queued=16)

    step = autoscale(chat, clock(0))

    assert (step.action, step.after) == (Scaling.UP, 4)
    new = list(vms_of(step))
    assert [vm.state for vm in new] == [State.PENDING] * 3
    assert len({vm.demand_group for vm in new}) == 1
    plan = tick(fleet_east)
    assert plan.status == Plan.Status.PROPOSED and plan.mode == "dry_run" and plan.complete
    placed = {
        action.vm_id: action
        for action in plan.actions.filter(kind=Kind.PLACEMENT).select_related("node")
    }
    assert {vm.pk for vm in new} <= set(placed)  # the whole step is placed, together
    assert {placed[vm.pk].group for vm in new} == {new[0].demand_group}
    assert all(len(placed[vm.pk].gpus) == 4 for vm in new)
    assert not plan.actions.filter(kind=Kind.UNSATISFIED).exists()
    # Dry run: shown, not done. The replicas wait for Approve.
    assert set(chat.replicas.values_list("state", flat=True)) == {State.PENDING}

    client = Client()
    client.force_login(operator)
    page = client.get(SET_PAGE).content.decode()
    rows = page.split('class="placement-row"')[1:]
    for vm in new:
        assert any(
            f'class="vm-name">{vm.name}</a>' in row and vm.instance_id in row for row in rows
        )


def place_and_run(fleet_east, operator) -> None:
    """Approve the set's plan and let every VM it placed boot."""
    plan = plans.plan_approve(plan=tick(fleet_east), actor=operator)
    for action in plan.actions.filter(kind=Kind.PLACEMENT).select_related("vm"):
        rentals.vm_mark_running(vm=action.vm, ip_address="10.60.0.1")


@pytest.fixture
def outranked(fleet_east, other_tenant):
    """h100-inference outranked by h100-ondemand, which globex may use, and with no floor of its
    own: only ``min_replicas`` protects a deployment's replicas."""
    capacity_set, pools = fleet_east["sets"]["h100-east"], fleet_east["pools"]
    fleet.pool_rerank(
        capacity_set=capacity_set, pool_names=["h100-ondemand", "h100-inference", "h100-spot"]
    )
    fleet.pool_set_floor(pool=pools["h100-inference"], floor_gpus=0)
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[other_tenant])

    def request(name: str):
        return request_vm(other_tenant, pools["h100-ondemand"], name=name, gpu_count=8)

    return request


def test_a_set_full_of_replicas_at_min_replicas_loses_none_to_a_higher_ranked_demand(
    deploy, fleet_east, operator, outranked
):
    chat = deploy(where="set", min_replicas=4, max_replicas=4, gpus_per_replica=4)
    place_and_run(fleet_east, operator)
    assert chat.replicas.filter(state=State.RUNNING).count() == 4  # all 16 GPUs of the set

    train = outranked("train-1")
    plan = tick(fleet_east)

    assert not plan.actions.filter(kind=Kind.PREEMPTION).exists()
    (unsatisfied,) = plan.actions.filter(kind=Kind.UNSATISFIED)
    assert unsatisfied.vm_id == train.pk
    assert (
        "below its minimum of 4 replicas" in unsatisfied.reason and chat.slug in unsatisfied.reason
    )


def test_a_higher_ranked_demand_reclaims_autoscaled_replicas_only_down_to_min_replicas(
    deploy, fleet_east, operator, outranked, clock
):
    chat = deploy(where="set", min_replicas=2, max_replicas=4, gpus_per_replica=4)
    router_load(chat, queued=16)
    assert autoscale(chat, clock(0)).after == 4
    place_and_run(fleet_east, operator)
    assert chat.replicas.filter(state=State.RUNNING).count() == 4

    first, second = outranked("train-1"), outranked("train-2")
    plan = tick(fleet_east)

    victims = list(plan.actions.filter(kind=Kind.PREEMPTION).select_related("vm"))
    assert len(victims) == 2 and {v.vm.deployment_id for v in victims} == {chat.pk}
    assert {v.for_vm_id for v in victims} == {first.pk}
    assert any("keeps 2 replicas, minimum 2" in v.reason for v in victims)
    (unsatisfied,) = plan.actions.filter(kind=Kind.UNSATISFIED)
    assert unsatisfied.vm_id == second.pk
    assert "below its minimum of 2 replicas" in unsatisfied.reason
