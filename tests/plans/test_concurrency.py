"""Plans applied under concurrency (DESIGN.md section 8): applying is serialized per set and
idempotent. Two operators approving one plan at once apply it once; two REAL worker processes
ticking one enforcing set at once never notify a VM twice, never give a GPU to two VMs, never
place a demand twice; a stale Approve gets 409 and changes nothing; a worker killed with
SIGKILL at any point of an apply (a kill point, `gpucap.killpoints`) loses nothing and doubles
nothing once another worker takes over, and the plan history names one plan per placement.

What is asserted is what users see: VM states, notices, who holds which GPU, audit records.
"""

import itertools
import re
import threading
import time
from collections.abc import Callable

import pytest
from django.db import connection
from django.db.models import Count
from django.urls import reverse

from gpucap.audit.models import AuditEvent
from gpucap.celery import app
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals import services as rentals
from gpucap.rentals.models import Allocation, VirtualMachine
from tests.conftest import TEST_METADATA_REDIS_URL
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.conftest import wait_for
from tests.rentals.vm_helpers import request_vm, world

State = VirtualMachine.State
Kind = PlanAction.Kind
# Where acme's four 4-GPU spot VMs fill h100-east: both halves of both nodes.
SPOT_PLACES = [
    (node, half) for node in ("h100-001", "h100-002") for half in ([0, 1, 2, 3], [4, 5, 6, 7])
]
Mode = CapacitySet.Mode

# The rentals fixtures: real workers on a queue of this run's own, captured tasks, the simulated
# fleet of this test database.
celery_queue = rentals_fixtures.celery_queue
sent_tasks = rentals_fixtures.sent_tasks
sim = rentals_fixtures.sim
workers = rentals_fixtures.workers


# --- helpers -------------------------------------------------------------------------------------


def race(calls: list[Callable[[], object]]) -> list[tuple[str, object]]:
    """Run each call in its own thread (its own database connection), all released at once by
    a barrier. Returns ("ok", result) or ("error", exception) per call, in order."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[tuple[str, object] | None] = [None] * len(calls)

    def run(position: int, call: Callable[[], object]) -> None:
        try:
            barrier.wait(timeout=30)
            outcomes[position] = ("ok", call())
        except Exception as exc:  # every outcome is asserted by the test
            outcomes[position] = ("error", exc)
        finally:
            connection.close()  # this thread's connection, not the test's

    threads = [threading.Thread(target=run, args=item) for item in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a racer never finished"
    return outcomes


def state_of(vm: VirtualMachine) -> str:
    return VirtualMachine.objects.values_list("state", flat=True).get(pk=vm.pk)


def events(vm: VirtualMachine, verb: str) -> int:
    return AuditEvent.objects.filter(
        object_type="virtualmachine", object_id=str(vm.pk), verb=verb
    ).count()


def victims_of(plan: Plan) -> list[VirtualMachine]:
    return [
        action.vm
        for action in plan.actions.filter(kind=Kind.PREEMPTION).select_related("vm").order_by("pk")
    ]


def notices_per_vm() -> dict[str, int]:
    """Every notice ever sent (open or completed), counted per VM name."""
    return dict(
        InterruptionNotice.objects.values_list("vm__name")
        .annotate(n=Count("id"))
        .values_list("vm__name", "n")
    )


def assert_no_gpu_ever_held_twice() -> None:
    """No two live allocations of one GPU now, and over the whole history no two allocations
    of one GPU overlapped in time."""
    doubled = (
        Allocation.objects.filter(released_at=None)
        .values("gpu_id")
        .annotate(holders=Count("id"))
        .filter(holders__gt=1)
    )
    assert not doubled.exists(), list(doubled)
    for gpu_id in Allocation.objects.values_list("gpu_id", flat=True).distinct():
        spans = list(
            Allocation.objects.filter(gpu_id=gpu_id)
            .order_by("created_at", "pk")
            .values_list("created_at", "released_at")
        )
        for (_, released), (next_created, _) in itertools.pairwise(spans):
            assert released is not None and released <= next_created, f"GPU {gpu_id} shared"


def assert_placed_once(vm: VirtualMachine, *, state: str = State.RUNNING) -> None:
    """The VM was placed once, holds its GPUs on one node, and never held any other."""
    assert state_of(vm) == state
    assert events(vm, "vm.provisioning") == 1
    allocations = Allocation.objects.filter(vm=vm)
    assert allocations.count() == vm.gpu_count, "placed on GPUs twice"
    assert not allocations.exclude(released_at=None).exists()
    assert allocations.values("gpu__node").distinct().count() == 1


def stop_victims(plan: Plan) -> None:
    """The victims' notices run out and the driver reports them off."""
    for vm in victims_of(plan):
        rentals.vm_mark_stopped(vm=rentals.vm_stop_for_notice(vm=vm, message="deadline"))


def tick(capacity_set: CapacitySet) -> Plan:
    return services.capacity_set_tick(capacity_set_id=capacity_set.pk).plan


# --- (a) two operators approve one plan at once ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(3))
def test_two_approvals_of_one_plan_at_once_apply_it_once(
    sent_tasks, h100, full_set, on_demand_request, operator, attempt
):
    train = on_demand_request()
    plan = tick(h100)
    victims = victims_of(plan)
    assert len(victims) == 2

    outcomes = race([lambda: services.plan_approve(plan=plan, actor=operator)] * 2)

    assert sorted(kind for kind, _ in outcomes) == ["error", "ok"], outcomes
    (refusal,) = [value for kind, value in outcomes if kind == "error"]
    assert isinstance(refusal, Conflict) and refusal.code == "plan_already_applied", refusal
    plan.refresh_from_db()
    assert plan.status == Plan.Status.APPLIED
    # One notice per victim, one scheduled stop each, one audit record each.
    assert notices_per_vm() == {vm.name: 1 for vm in victims}
    assert all(state_of(vm) == State.NOTIFIED for vm in victims)
    assert [name for name, _ in sent_tasks].count("notices.deadline_stop") == 2
    assert all(events(vm, "notice.arbiter") == 1 for vm in victims)
    assert AuditEvent.objects.filter(verb="plan.approve").count() == 1

    # The victims go; two ticks at once complete the approved placement: once.
    stop_victims(plan)
    outcomes = race([lambda: tick(h100)] * 2)

    assert [kind for kind, _ in outcomes] == ["ok", "ok"], outcomes
    assert_placed_once(train, state=State.PROVISIONING)
    assert sent_tasks.count(("rentals.vm_provision", [train.pk])) == 1
    assert_no_gpu_ever_held_twice()


# --- (b) two real workers tick one enforcing set at once ------------------------------------------


@pytest.fixture
def booted_spots(fleet_east, h100, tenant, other_tenant, settings) -> Callable:
    """``booted_spots(worker)``: acme's four 4-GPU spot VMs filling h100-east, booted by the
    worker through the simulated driver. globex may rent on-demand VMs in the set; notices
    last 2 s."""
    settings.PLANS_DEBOUNCE_SECONDS = 1
    cluster = fleet_east["cluster"]
    cluster.driver_settings = {"boot_seconds": 0.3}
    cluster.save(update_fields=["driver_settings"])
    fleet.capacity_set_update(capacity_set=h100, notice_seconds=2)
    fleet.pool_set_tenants(pool=fleet_east["pools"]["h100-ondemand"], tenants=[other_tenant])
    pool, nodes = fleet_east["pools"]["h100-spot"], fleet_east["nodes"]

    def boot(worker) -> list[VirtualMachine]:
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
        return vms

    return boot


def ask(fleet_east, other_tenant, name: str, gpus: int) -> VirtualMachine:
    return request_vm(other_tenant, fleet_east["pools"]["h100-ondemand"], name=name, gpu_count=gpus)


class Beat:
    """What Celery beat sends (it is not running in these tests), at most every half second
    however often it is called: ticks of the set, the notice sweep (the safety net under a lost
    scheduled stop) and the reconciler (which sends a lost driver task again)."""

    def __init__(self, capacity_set: CapacitySet, *, ticks: int = 1) -> None:
        self.capacity_set, self.ticks, self.last = capacity_set, ticks, 0.0

    def __call__(self) -> None:
        if time.monotonic() - self.last < 0.5:
            return
        self.last = time.monotonic()
        for _ in range(self.ticks):
            app.send_task("plans.tick", args=[self.capacity_set.pk])
        app.send_task("notices.sweep")
        app.send_task("rentals.reconcile")


WORKER_ENV = {
    "PLANS_DEBOUNCE_SECONDS": "1",
    "METADATA_REDIS_URL": TEST_METADATA_REDIS_URL,
    "RENTALS_RECONCILE_GRACE_SECONDS": "2",
}


def test_two_workers_ticking_one_enforcing_set_at_once_notify_and_place_each_vm_once(
    workers, h100, booted_spots, fleet_east, other_tenant, operator, sim
):
    first = workers(**WORKER_ENV)
    spots = booted_spots(first)
    second = workers(**WORKER_ENV)
    services.capacity_set_set_mode(capacity_set=h100, mode=Mode.ENFORCE, actor=operator)
    # globex asks for 12 GPUs of the full set: three spot VMs must go.
    train = ask(fleet_east, other_tenant, "train-1", 8)
    infer = ask(fleet_east, other_tenant, "infer-1", 4)

    # Both workers (two processes each) tick the set at once, over and over, until both run.
    for _ in range(20):
        app.send_task("plans.tick", args=[h100.pk])
        app.send_task("plans.replan", args=[h100.pk])

    beat = Beat(h100, ticks=4)

    def both_running() -> bool:
        beat()
        return state_of(train) == state_of(infer) == State.RUNNING

    wait_for(
        both_running, timeout=45, what="both on-demand VMs", log=lambda: first.log() + second.log()
    )

    assert_placed_once(train)
    assert_placed_once(infer)
    assert_no_gpu_ever_held_twice()
    # Three victims, each notified exactly once (every notice ever sent, open or not).
    notified = notices_per_vm()
    assert sorted(notified.values()) == [1, 1, 1], notified
    assert all(events(vm, "notice.arbiter") == notified.get(vm.name, 0) for vm in spots)
    assert sorted(state_of(vm) for vm in spots) == [State.PENDING] * 3 + [State.RUNNING]
    # The victims' GPUs went to exactly the two on-demand VMs.
    held = dict(
        Allocation.objects.filter(released_at=None)
        .values_list("vm__name")
        .annotate(n=Count("id"))
        .values_list("vm__name", "n")
    )
    assert held.pop("train-1") == 8 and held.pop("infer-1") == 4
    assert list(held.values()) == [4]
    # Both workers really did tick the set.
    for worker in (first, second):
        assert "Task plans.tick[" in worker.log(), worker.name
        assert "raised unexpected" not in worker.log(), worker.log()


# --- (c) a stale Approve ------------------------------------------------------------------------


@pytest.mark.django_db
def test_approving_a_plan_the_set_outran_is_409_with_the_fresh_plan_and_changes_nothing(
    h100, full_set, on_demand_request, operator_api
):
    on_demand_request()
    seen = tick(h100)
    on_demand_request(name="train-2")  # another request lands while the operator reads
    before = world()

    response = operator_api.post(f"/api/plans/{seen.pk}/approve/")

    assert response.status_code == 409, response.json()
    body = response.json()
    assert body["error"]["code"] == "stale_plan"
    fresh = body["fresh_plan"]
    assert fresh["id"] != seen.pk and fresh["status"] == Plan.Status.PROPOSED
    assert fresh["placements"] == 2 and fresh["preemptions"] == 4
    assert any("now places" in line for line in body["changes"]), body["changes"]
    after = world()
    assert after["vms"] == before["vms"] and after["allocations"] == before["allocations"]
    assert not InterruptionNotice.objects.exists()

    # Approving what the operator now sees works.
    response = operator_api.post(f"/api/plans/{fresh['id']}/approve/")
    assert response.status_code == 200, response.json()
    assert sorted(notices_per_vm().values()) == [1, 1, 1, 1]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(3))
def test_an_approve_racing_a_new_request_either_applies_the_plan_seen_or_is_refused(
    sent_tasks, h100, full_set, on_demand_request, operator, attempt
):
    on_demand_request()
    seen = tick(h100)
    victims = victims_of(seen)

    outcomes = race(
        [
            lambda: services.plan_approve(plan=seen, actor=operator),
            lambda: on_demand_request(name="train-2"),
        ]
    )

    (approve, (request_kind, _)) = outcomes
    assert request_kind == "ok", outcomes
    if approve[0] == "ok":
        # The approval came first: exactly the plan seen was applied.
        assert notices_per_vm() == {vm.name: 1 for vm in victims}
    else:
        # The request came first: the approval is refused and nothing was done.
        assert isinstance(approve[1], services.StalePlan), approve
        assert not InterruptionNotice.objects.exists()
        assert all(state_of(vm) == State.RUNNING for vm in full_set)
    assert_no_gpu_ever_held_twice()


# --- (d) a worker killed mid-tick ---------------------------------------------------------------


# Where the first worker dies (gpucap.killpoints): an exact point of the apply, or of the
# completion of its waiting placement, named in the worker's environment. The worker SIGKILLs
# its whole process group there, so where it died is known, not raced against a clock.
KILL_POINTS = {
    "while-planning": "plans.apply:start",
    "after-the-notices-before-the-placement-is-recorded": "plans.apply:notices-sent",
    "after-the-placement-before-the-plan-is-applied": "plans.apply:placements-recorded",
    "right-after-the-notices": "plans.apply:committed",
    "while-placing": "plans.placements:placed",
}


@pytest.mark.parametrize("kill_at", list(KILL_POINTS.values()), ids=list(KILL_POINTS))
def test_a_worker_killed_mid_tick_loses_nothing_and_doubles_nothing(
    workers,
    h100,
    booted_spots,
    fleet_east,
    other_tenant,
    operator,
    operator_api,
    operator_client,
    sim,
    kill_at,
):
    first = workers(**WORKER_ENV, TEST_KILL_AT=kill_at)
    spots = booted_spots(first)
    # train-1 asks while the set is still in dry-run: the first plan applied is one placing it.
    train = ask(fleet_east, other_tenant, "train-1", 8)
    services.capacity_set_set_mode(capacity_set=h100, mode=Mode.ENFORCE, actor=operator)
    for _ in range(20):
        app.send_task("plans.tick", args=[h100.pk])
    beat = Beat(h100)

    def died() -> bool:
        beat()
        return first.process.poll() is not None

    wait_for(died, timeout=30, what=f"the worker to die at {kill_at}", log=first.log)
    assert f"kill point {kill_at}: SIGKILL" in first.log(), first.log()
    first.kill()  # its unacknowledged messages stay unacknowledged for an hour
    second = workers(**WORKER_ENV)

    def running() -> bool:
        beat()
        return state_of(train) == State.RUNNING

    wait_for(running, timeout=45, what="train-1 to run", log=second.log)

    assert_placed_once(train)
    assert_no_gpu_ever_held_twice()
    # Exactly one applied plan placed train-1, and it notified each of its victims once.
    (plan,) = Plan.objects.filter(
        status=Plan.Status.APPLIED, actions__kind=Kind.PLACEMENT, actions__vm=train
    )
    victims = victims_of(plan)
    assert len(victims) == 2
    assert notices_per_vm() == {vm.name: 1 for vm in victims}
    assert all(events(vm, "notice.arbiter") == 1 for vm in victims)
    assert all(state_of(vm) == State.PENDING for vm in victims)
    assert all(state_of(vm) == State.RUNNING for vm in spots if vm not in victims)
    assert Allocation.objects.filter(vm__in=victims, released_at=None).count() == 0, (
        "the victims let go of their GPUs"
    )
    # The history tells the same story: that plan notified the victims and placed train-1, and
    # no other applied plan placed anything.
    placement = plan.actions.get(kind=Kind.PLACEMENT)
    assert placement.progress == PlanAction.Progress.DONE, placement.progress_message
    assert all(
        a.progress == PlanAction.Progress.DONE for a in plan.actions.filter(kind=Kind.PREEMPTION)
    )
    assert_one_plan_shows_the_placement(operator_api, operator_client, h100, plan, train, victims)


def assert_one_plan_shows_the_placement(
    api, client, capacity_set: CapacitySet, plan: Plan, vm: VirtualMachine, victims: list
) -> None:
    """``GET /api/plans/`` and the set page's plan history (the set's last 20 plans: a handful
    here) show ``plan`` as the one applied plan with a placement, and its page and
    ``GET /api/plans/{id}/`` show ``vm`` placed by it after notices to ``victims``."""
    listed = api.get(
        "/api/plans/", {"capacity_set": capacity_set.pk, "status": "applied", "limit": 500}
    ).json()
    assert listed["count"] == len(listed["results"])
    assert [entry["id"] for entry in listed["results"] if entry["placements"]] == [plan.pk]
    lines = api.get(f"/api/plans/{plan.pk}/").json()["actions"]
    assert [
        (line["instance_id"], line["progress"]) for line in lines if line["kind"] == "placement"
    ] == [(vm.instance_id, "done")]
    assert sorted(
        (line["instance_id"], line["progress"]) for line in lines if line["kind"] == "preemption"
    ) == sorted((victim.instance_id, "done") for victim in victims)

    page = client.get(reverse("fleet:capacity-set-detail", kwargs={"name": capacity_set.name}))
    history = page.content.decode().split('id="plan-history"')[1].split("</table>")[0]
    rows = re.findall(
        r'id="history-(\d+)".*?plan-status-(\w+)">.*?</span></td>\s*<td class="num">(\d+)</td>',
        history,
        re.S,
    )
    shown = {int(pk): (status, int(placements)) for pk, status, placements in rows}
    assert shown.get(plan.pk) == ("applied", 1), shown
    others = [
        pk for pk, (status, n) in shown.items() if pk != plan.pk and status == "applied" and n
    ]
    assert not others, f"plans {others} placed something too"
    detail = client.get(
        reverse("plans:detail", kwargs={"name": capacity_set.name, "plan_id": plan.pk})
    ).content.decode()
    assert "1 of 1 placement done" in detail, detail
    placed = detail.split('class="table plan-table placements"')[1].split("</table>")[0]
    assert vm.name in placed
    assert re.search(r'progress-done">placed(, booting|, running)?</span>', placed), placed
