"""Protection windows on the live fleet (#17 build 2): a pool's ``protect_seconds`` keeps a VM
that just started or resumed from being reclaimed while another VM can be; when only protected
VMs could serve a demand, the plan says until when, and the set is planned again at that moment.
"""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from gpucap.arbiter import model as am
from gpucap.celery import app
from gpucap.fleet import services as fleet
from gpucap.plans import services
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.plans.test_end_to_end import SPOT_PLACES, state_of
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.conftest import wait_for
from tests.rentals.vm_helpers import request_vm

Kind = PlanAction.Kind
State = VirtualMachine.State
SET_PAGE = reverse("fleet:capacity-set-detail", kwargs={"name": "h100-east"})
TEN_MINUTES = 600

celery_queue = rentals_fixtures.celery_queue
workers = rentals_fixtures.workers


def tick(capacity_set) -> Plan:
    return services.capacity_set_tick(capacity_set_id=capacity_set.pk).plan


def victims_of(plan: Plan) -> list[str]:
    return sorted(a.vm.name for a in plan.actions.filter(kind=Kind.PREEMPTION).select_related("vm"))


def started(vm: VirtualMachine, ago: timedelta) -> VirtualMachine:
    """As if ``vm`` had started or resumed ``ago`` before now."""
    VirtualMachine.objects.filter(pk=vm.pk).update(started_at=timezone.now() - ago)
    return VirtualMachine.objects.get(pk=vm.pk)


@pytest.fixture
def spot_pool(fleet_east):
    return fleet_east["pools"]["h100-spot"]


@pytest.fixture
def sent_replans(monkeypatch) -> list[tuple[list, dict]]:
    """The ``plans.replan`` tasks sent, as ``(args, options)``; the broker gets nothing."""
    sent = []

    def send_task(name, args=None, **options):
        if name == "plans.replan":
            sent.append((list(args or []), options))

    monkeypatch.setattr(app, "send_task", send_task)
    return sent


def test_a_spot_vm_that_just_resumed_is_passed_over_for_one_that_can_be_reclaimed(
    h100, full_set, on_demand_request, spot_pool
):
    for vm in full_set[:3]:
        started(vm, timedelta(hours=2))
    started(full_set[3], timedelta(minutes=1))  # spot-4 just resumed
    on_demand_request(gpu_count=4)
    assert victims_of(tick(h100)) == ["spot-4"], "rule 7 alone takes the freshest VM"

    fleet.pool_set_protect(pool=spot_pool, protect_seconds=TEN_MINUTES)
    plan = tick(h100)

    assert plan.complete and victims_of(plan) == ["spot-3"]


def test_when_only_protected_vms_could_serve_the_demand_waits_and_says_until_when(
    h100,
    full_set,
    on_demand_request,
    spot_pool,
    operator_client,
    operator_api,
    sent_replans,
    django_capture_on_commit_callbacks,
):
    fleet.pool_set_protect(pool=spot_pool, protect_seconds=TEN_MINUTES)
    for n, vm in enumerate(full_set):
        started(vm, timedelta(minutes=5 - n))
    train = on_demand_request(gpu_count=4)
    sent_replans.clear()

    with django_capture_on_commit_callbacks(execute=True):
        plan = tick(h100)

    assert not plan.complete and plan.preemptions == 0
    waiting = plan.actions.get(kind=Kind.UNSATISFIED)
    fresh = VirtualMachine.objects.get(pk=full_set[3].pk)  # the one rule 7 would take
    until = fresh.started_at + timedelta(seconds=TEN_MINUTES)
    assert waiting.vm == train and waiting.waits_until == until
    assert f"protected until {until:%H:%M}" in waiting.reason
    assert "pool h100-spot protects VMs for 600 s" in waiting.reason
    # The set is planned again when that protection ends, once however often it is asked.
    assert sent_replans == [([h100.pk], {"eta": until})]
    with django_capture_on_commit_callbacks(execute=True):
        services._wake_when_protection_ends(h100, _unsatisfied_until(train, until))
    assert len(sent_replans) == 1

    line = next(
        a
        for a in operator_api.get(f"/api/plans/{plan.pk}/").json()["actions"]
        if a["kind"] == "unsatisfied"
    )
    assert line["waits_until"].startswith(f"{until:%Y-%m-%dT%H:%M}")
    assert f"protected until {until:%H:%M}" in line["reason"]
    page = operator_client.get(SET_PAGE).content.decode()
    assert f"protected until {until:%H:%M}" in page
    assert "protects VMs for 10 min after they start or resume" in page


def _unsatisfied_until(vm, until):
    entry = am.Unsatisfied(
        demand=vm.instance_id, group=vm.instance_id, reason="", waits_until=until
    )
    return am.Plan(complete=False, placements=(), preemptions=(), unsatisfied=(entry,), pools=())


def test_a_plan_whose_wait_for_protection_ended_is_made_again(
    h100, full_set, on_demand_request, spot_pool
):
    """The generation did not change, but time did: the next tick plans anew and serves it."""
    fleet.pool_set_protect(pool=spot_pool, protect_seconds=TEN_MINUTES)
    for n, vm in enumerate(full_set):
        started(vm, timedelta(minutes=5 - n))
    on_demand_request(gpu_count=4)
    waiting = tick(h100)
    assert tick(h100) == waiting, "nothing changed, nothing ended: the same plan"

    started(full_set[3], timedelta(minutes=11))  # as if its protection had just ended
    PlanAction.objects.filter(plan=waiting).update(waits_until=timezone.now())
    served = tick(h100)

    assert served != waiting and served.complete and victims_of(served) == ["spot-4"]


def test_the_set_page_shows_no_protection_for_a_pool_without_one(h100, full_set, operator_client):
    page = operator_client.get(SET_PAGE).content.decode()
    assert "after they start or resume" not in page


# --- with a real worker: the replan at the moment protection ends ---------------------------------


@pytest.fixture
def quick_set(fleet_east, settings):
    """h100-east with VMs that boot in half a second; changes wait one second for others
    before the set is planned."""
    settings.PLANS_DEBOUNCE_SECONDS = 1
    cluster = fleet_east["cluster"]
    cluster.driver_settings = {"boot_seconds": 0.5}
    cluster.save(update_fields=["driver_settings"])
    return fleet_east["sets"]["h100-east"]


@pytest.fixture
def worker(workers, quick_set, sim):
    return workers(PLANS_DEBOUNCE_SECONDS="1")


def test_the_replan_when_protection_ends_serves_the_waiting_demand(
    worker, quick_set, fleet_east, tenant, other_tenant
):
    pools, nodes = fleet_east["pools"], fleet_east["nodes"]
    fleet.pool_set_protect(pool=pools["h100-spot"], protect_seconds=8)
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[other_tenant])
    spots = []
    for n, (node, gpus) in enumerate(SPOT_PLACES, start=1):
        vm = request_vm(tenant, pools["h100-spot"], name=f"spot-{n}", gpu_count=4)
        spots.append(rentals.vm_place(vm=vm, node=nodes[node], gpu_indices=gpus))
    wait_for(
        lambda: all(state_of(vm) == State.RUNNING for vm in spots),
        timeout=30,
        what="the spot VMs to boot",
        log=worker.log,
    )
    train = request_vm(other_tenant, pools["h100-ondemand"], name="train-1", gpu_count=4)

    def plan_for_train() -> PlanAction | None:
        return (
            PlanAction.objects.filter(vm=train, plan__capacity_set=quick_set)
            .order_by("-plan__created_at", "-plan_id")
            .first()
        )

    # Freshly booted, every spot VM is protected: the worker's plan makes train-1 wait.
    waiting = wait_for(
        lambda: (line := plan_for_train()) is not None and line.waits_until and line,
        timeout=30,
        what="a plan in which train-1 waits for protection",
        log=worker.log,
    )
    assert waiting.kind == Kind.UNSATISFIED and "protected until" in waiting.reason
    # Nothing changes in the set from here on; only the wake-up at waits_until plans it again.
    served = wait_for(
        lambda: (line := plan_for_train()) is not None and line.kind == Kind.PLACEMENT and line,
        timeout=60,
        what="the replan at the end of protection to place train-1",
        log=worker.log,
    )
    assert served.plan.created_at >= waiting.waits_until
    assert served.plan.preemptions == 1


def test_the_tenant_whose_vm_waits_for_protection_is_told_until_when(
    h100, full_set, on_demand_request, spot_pool, other_member_api, other_member_client
):
    fleet.pool_set_protect(pool=spot_pool, protect_seconds=TEN_MINUTES)
    for n, vm in enumerate(full_set):
        started(vm, timedelta(minutes=5 - n))
    train = on_demand_request(gpu_count=4)  # globex's
    tick(h100)
    until = VirtualMachine.objects.get(pk=full_set[3].pk).started_at + timedelta(
        seconds=TEN_MINUTES
    )

    waiting = other_member_api.get(f"/api/vms/{train.pk}/").json()["waiting"]

    assert waiting["reason"] == "protected"
    assert f"protected until {until:%H:%M} UTC" in waiting["message"]
    assert waiting["starts_by"].startswith(f"{until:%Y-%m-%dT%H:%M}")
    # In words that name no other tenant's VM or pool.
    assert "spot" not in waiting["message"] and "acme" not in waiting["message"]
    page = other_member_client.get(reverse("rentals:vm-detail", args=[train.pk])).content.decode()
    assert f"protected until {until:%H:%M} UTC" in page

    # Once the window has passed, the stale line no longer speaks for it.
    PlanAction.objects.filter(vm=train, kind=Kind.UNSATISFIED).update(
        waits_until=timezone.now() - timedelta(seconds=1)
    )
    assert other_member_api.get(f"/api/vms/{train.pk}/").json()["waiting"]["reason"] == (
        "no_capacity"
    )
