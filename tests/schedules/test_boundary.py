"""A schedule's boundary end to end (issue #18): when a window opens, what it puts in force
reaches the fleet. The entry raises h100-inference's floor and the chat deployment's
min_replicas at 08:00 in New York; the boundary is applied (generation bumped, audited), the
autoscaler asks for the replicas the new minimum needs, and the set's arbiter plans for them:
in ``enforce`` the lower-ranked spot VMs get their notices, in ``dry_run`` the same victims are
only named in the plan preview.

The story runs on h100-east full of acme's four running 4-GPU spot VMs (tests/plans/conftest.py:
spot-1 started first, spot-4 last), with an explicit clock (``now``) for the schedule, then
with a real Celery worker on a short clock: a window opening a few seconds from now, applied at
its moment by the task `wake_at` sent for it. Also: beat's safety net applies a boundary whose
task was lost, once; a plan made before a boundary is stale after it; replicas follow a range
in force above the deployment's own; and the API, pages and metrics give the values in force.
"""

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.celery import app
from gpucap.fleet.models import CapacitySet, Pool
from gpucap.inference import autoscaler
from gpucap.inference import services as inference
from gpucap.inference.models import InferenceDeployment
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services as plans
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals.models import VirtualMachine
from gpucap.schedules import services, tasks
from tests.conftest import TEST_INFERENCE_REDIS_URL
from tests.inference import conftest as inference_fixtures
from tests.metrics import conftest as metrics_fixtures
from tests.plans import conftest as plans_fixtures
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.conftest import wait_for

State = VirtualMachine.State
Kind = PlanAction.Kind
Mode = CapacitySet.Mode

# Wednesday 2 December 2026: 13:00 UTC is 08:00 in New York, when the day shift opens.
OPENS = datetime(2026, 12, 2, 13, 0, tzinfo=UTC)
BEFORE = OPENS - timedelta(minutes=1)
SLUG = "acme-chat"

# The plans fixtures (the full set, globex's on-demand request) and the inference ones (acme may
# deploy in h100-inference; the router's Redis documents in a database of the tests' own).
h100 = plans_fixtures.h100
full_set = plans_fixtures.full_set
on_demand_request = plans_fixtures.on_demand_request
inference_pools = inference_fixtures.inference_pools
inference_redis = inference_fixtures.inference_redis
celery_queue = rentals_fixtures.celery_queue
sim = rentals_fixtures.sim
workers = rentals_fixtures.workers
metrics_token = metrics_fixtures.metrics_token
scrape = metrics_fixtures.scrape


def day_shift(**window) -> dict:
    """Inference keeps 8 GPUs from 08:00 to 20:00 New York time on weekdays: its floor protects
    them, and two 4-GPU replicas of chat make the pool take them."""
    return {
        "name": "day-shift",
        "days": "mon-fri",
        "start": "08:00",
        "end": "20:00",
        "time_zone": "America/New_York",
        "pools": {"h100-inference": {"floor_gpus": 8}},
        "deployments": {SLUG: {"min_replicas": 2}},
        **window,
    }


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, list, dict]]:
    """Every task sent, as ``(name, args, options)``; the broker gets nothing."""
    found: list[tuple[str, list, dict]] = []

    def send_task(name, args=None, **options):
        found.append((name, list(args or []), options))

    monkeypatch.setattr(app, "send_task", send_task)
    return found


@pytest.fixture
def chat(inference_pools, tenant, member) -> InferenceDeployment:
    """acme's chat deployment in h100-inference: 4-GPU replicas, none when idle (0..2)."""
    return inference.deployment_create(
        tenant=tenant,
        pool=inference_pools["set"],
        name="chat",
        model_name="gpucap/sim-8b",
        gpus_per_replica=4,
        min_replicas=0,
        max_replicas=2,
        actor=member,
    )


def in_mode(capacity_set: CapacitySet, mode: str, operator) -> CapacitySet:
    return plans.capacity_set_set_mode(capacity_set=capacity_set, mode=mode, actor=operator)


def victims(plan: Plan) -> list[str]:
    lines = plan.actions.filter(kind=Kind.PREEMPTION).select_related("vm")
    return sorted(line.vm.name for line in lines)


def noticed() -> list[str]:
    return sorted(InterruptionNotice.objects.values_list("vm__name", flat=True))


def replicas(deployment: InferenceDeployment) -> list[VirtualMachine]:
    return list(VirtualMachine.objects.filter(deployment=deployment).order_by("pk"))


def generation(capacity_set: CapacitySet) -> int:
    return CapacitySet.objects.get(pk=capacity_set.pk).generation


def boundary(capacity_set, at, capture) -> list[str]:
    """Apply the set's schedule at ``at``, running what it sends on commit."""
    with capture(execute=True):
        return services.policy_apply(capacity_set=capacity_set, now=at)


# --- with an explicit clock ----------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("mode", [Mode.ENFORCE, Mode.DRY_RUN])
def test_a_boundary_raises_the_floor_asks_for_replicas_and_the_arbiter_reclaims_spot(
    mode, h100, full_set, chat, operator, sent, django_capture_on_commit_callbacks
):
    in_mode(h100, mode, operator)
    services.schedule_entry_save(capacity_set=h100, data=day_shift(), actor=operator, now=BEFORE)
    # A minute before the window opens, nothing is in force and the set needs nothing.
    assert boundary(h100, BEFORE, django_capture_on_commit_callbacks) == []
    assert plans.capacity_set_tick(capacity_set_id=h100.pk).plan.preemptions == 0
    before = generation(h100)
    sent.clear()

    words = boundary(h100, OPENS, django_capture_on_commit_callbacks)

    assert words == [
        "pool h100-inference floor 4 → 8 GPUs",
        f"deployment {SLUG} replicas 0-2 → 2-2",
    ]
    assert generation(h100) == before + 1
    applied = AuditEvent.objects.get(verb="policy.apply")
    assert applied.message == "; ".join(words)
    assert applied.after["sources"] == {
        "pool h100-inference's floor_gpus": 'entry "day-shift"',
        f"deployment {SLUG}'s min_replicas": 'entry "day-shift"',
    }
    assert Pool.objects.get(name="h100-inference").floor_in_force == 8
    # The deployment is woken at once, and the set's next boundary (20:00) is sent for.
    assert ("inference.wake", [SLUG], {}) in sent
    closes = OPENS + timedelta(hours=12)
    assert ("schedules.apply", [h100.pk], {"eta": closes}) in sent

    # The woken autoscaler asks for the two replicas the new minimum needs, as one group.
    scaling = autoscaler.deployment_wake(slug=SLUG, now=OPENS)
    assert (scaling.action, scaling.before, scaling.after) == ("up", 0, 2)
    asked = replicas(chat)
    assert [vm.state for vm in asked] == [State.PENDING, State.PENDING]
    assert len({vm.demand_group for vm in asked}) == 1

    # The set's arbiter serves them from the lowest-ranked pool, the freshest spot VMs first.
    tick = plans.capacity_set_tick(capacity_set_id=h100.pk)
    plan = tick.plan
    assert plan.generation > before
    assert victims(plan) == ["spot-3", "spot-4"]
    assert plan.placements == 2 and plan.complete
    spots = dict(
        VirtualMachine.objects.filter(name__startswith="spot-").values_list("name", "state")
    )
    if mode == Mode.ENFORCE:
        assert tick.applied and plan.status == Plan.Status.APPLIED
        assert noticed() == ["spot-3", "spot-4"]
        assert spots == {
            "spot-1": State.RUNNING,
            "spot-2": State.RUNNING,
            "spot-3": State.NOTIFIED,
            "spot-4": State.NOTIFIED,
        }
        assert AuditEvent.objects.filter(verb="plan.enforce").count() == 1
    else:
        # dry_run: the same boundary changes only the preview.
        assert not tick.applied and plan.status == Plan.Status.PROPOSED
        assert noticed() == []
        assert set(spots.values()) == {State.RUNNING}
        assert [vm.state for vm in replicas(chat)] == [State.PENDING, State.PENDING]
        assert not AuditEvent.objects.filter(verb="plan.enforce").exists()


@pytest.mark.django_db
def test_when_the_window_closes_the_minimum_falls_back_and_spot_is_not_reclaimed_again(
    h100, full_set, chat, operator, sent, django_capture_on_commit_callbacks
):
    in_mode(h100, Mode.ENFORCE, operator)
    services.schedule_entry_save(capacity_set=h100, data=day_shift(), actor=operator, now=BEFORE)
    boundary(h100, OPENS, django_capture_on_commit_callbacks)
    autoscaler.deployment_wake(slug=SLUG, now=OPENS)
    plans.capacity_set_tick(capacity_set_id=h100.pk)
    closes = OPENS + timedelta(hours=12)  # 20:00 in New York

    words = boundary(h100, closes, django_capture_on_commit_callbacks)

    assert words == [
        "pool h100-inference floor 8 → 4 GPUs",
        f"deployment {SLUG} replicas 2-2 → 0-2",
    ]
    chat.refresh_from_db()
    assert (chat.min_replicas_in_force, chat.max_replicas_in_force) == (0, 2)
    assert AuditEvent.objects.filter(verb="policy.apply").count() == 2
    assert plans.capacity_set_tick(capacity_set_id=h100.pk).plan.preemptions == 0
    assert noticed() == ["spot-3", "spot-4"]  # nobody else


# --- beat's safety net ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_boundary_whose_task_was_lost_is_applied_by_beat_once(
    h100, chat, operator, sent, django_capture_on_commit_callbacks
):
    services.schedule_entry_save(capacity_set=h100, data=day_shift(), actor=operator, now=BEFORE)
    before = generation(h100)
    sent.clear()  # the task sent for 08:00 is lost

    with django_capture_on_commit_callbacks(execute=True):
        assert services.policies_apply_due(now=OPENS + timedelta(seconds=30)) == 1

    chat.refresh_from_db()
    assert chat.min_replicas_in_force == 2
    assert generation(h100) == before + 1
    assert ("inference.wake", [SLUG], {}) in sent
    # The lost task arriving late, and beat's next pass, change nothing and audit nothing more.
    assert boundary(h100, OPENS + timedelta(seconds=40), django_capture_on_commit_callbacks) == []
    assert services.policies_apply_due(now=OPENS + timedelta(seconds=60)) == 0
    assert generation(h100) == before + 1
    assert AuditEvent.objects.filter(verb="policy.apply").count() == 1
    assert [name for name, _, _ in sent].count("inference.wake") == 1


@pytest.mark.django_db
def test_the_beat_task_and_the_boundary_task_run_on_the_clock(h100, chat, operator, sent):
    """The thin tasks read the clock themselves: a window that is open now is put in force."""
    now = timezone.now()
    open_now = day_shift(
        days="every day",
        start=f"{(now - timedelta(hours=1)):%H:%M}",
        end=f"{(now + timedelta(hours=1)):%H:%M}",
        time_zone="UTC",
    )
    # Written two hours ago, before the window opened; its wake-up is lost.
    earlier = now - timedelta(hours=2)
    services.schedule_entry_save(capacity_set=h100, data=open_now, actor=operator, now=earlier)

    assert tasks.apply_due() == 1
    assert tasks.apply(h100.pk) == 0
    assert tasks.apply(0) == 0  # a set deleted since the task was sent
    chat.refresh_from_db()
    assert chat.min_replicas_in_force == 2


# --- the generation ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_plan_made_before_the_boundary_cannot_be_approved_after_it(
    h100,
    full_set,
    chat,
    on_demand_request,
    operator,
    operator_api,
    sent,
    django_capture_on_commit_callbacks,
):
    services.schedule_entry_save(capacity_set=h100, data=day_shift(), actor=operator, now=BEFORE)
    on_demand_request(gpu_count=4)  # globex's, in rank 2: reclaims one spot VM
    earlier = plans.plan_make(capacity_set=h100)
    assert earlier.status == Plan.Status.PROPOSED and victims(earlier) == ["spot-4"]

    boundary(h100, OPENS, django_capture_on_commit_callbacks)

    with pytest.raises(plans.StalePlan):
        plans.plan_approve(plan=earlier, actor=operator)
    response = operator_api.post(f"/api/plans/{earlier.pk}/approve/")
    assert response.status_code == 409, response.json()
    body = response.json()
    assert body["error"]["code"] == "stale_plan"
    assert body["fresh_plan"]["generation"] == generation(h100)
    assert noticed() == []


# --- a range in force beyond the deployment's own ---------------------------------------------


@pytest.mark.django_db
def test_replicas_follow_a_scheduled_range_above_the_deployments_own(
    h100, chat, operator, sent, django_capture_on_commit_callbacks
):
    """chat's own range is 0..2; the day shift keeps 3 (one more than its own maximum)."""
    busy = day_shift(deployments={SLUG: {"min_replicas": 3, "max_replicas": 3}})
    services.schedule_entry_save(capacity_set=h100, data=busy, actor=operator, now=BEFORE)
    boundary(h100, OPENS, django_capture_on_commit_callbacks)

    scaling = autoscaler.deployment_wake(slug=SLUG, now=OPENS)

    assert (scaling.desired, scaling.after) == (3, 3)
    assert len(replicas(chat)) == 3
    # The tenant narrowing its own range while the schedule holds 3 does not take them away.
    inference.deployment_update(deployment=chat, max_replicas=1, min_replicas=0)
    live = VirtualMachine.objects.filter(deployment=chat, state=State.PENDING)
    assert live.count() == 3

    # When the window closes the range is its own again (0..1): above it, with no load, the
    # replicas go at once.
    boundary(h100, OPENS + timedelta(hours=12), django_capture_on_commit_callbacks)
    scaling = autoscaler.deployment_wake(slug=SLUG, now=OPENS + timedelta(hours=12))
    assert (scaling.action, scaling.before, scaling.after) == ("down", 3, 0)


@pytest.mark.django_db
def test_the_deployments_page_and_api_show_the_range_in_force_and_that_the_schedule_holds_it(
    h100,
    chat,
    operator,
    operator_client,
    member_api,
    member_client,
    sent,
    django_capture_on_commit_callbacks,
):
    page_url = reverse("inference:deployment-detail", kwargs={"slug": "acme", "name": "chat"})
    own = member_api.get(f"/api/deployments/{chat.pk}/").json()
    assert (own["min_replicas_in_force"], own["max_replicas_in_force"]) == (0, 2)
    assert own["range_from_schedule"] is False
    assert "schedule now" not in member_client.get(page_url).content.decode()
    services.schedule_entry_save(capacity_set=h100, data=day_shift(), actor=operator, now=BEFORE)
    boundary(h100, OPENS, django_capture_on_commit_callbacks)

    body = member_api.get(f"/api/deployments/{chat.pk}/").json()
    page = member_client.get(page_url).content.decode()

    assert (body["min_replicas"], body["max_replicas"]) == (0, 2)  # its own, unchanged
    assert (body["min_replicas_in_force"], body["max_replicas_in_force"]) == (2, 2)
    assert body["range_from_schedule"] is True
    assert "of 2..2" in page
    assert "from capacity set h100-east's schedule now; its own range is 0..2" in page
    assert "preemption never takes the deployment below 2." in page
    tenant_page = operator_client.get(reverse("tenant-detail", kwargs={"slug": "acme"}))
    assert "(range 2..2, scheduled)" in tenant_page.content.decode()


@pytest.mark.django_db
def test_the_pools_api_and_the_sets_list_show_the_rank_and_floor_in_force(
    h100, operator, operator_api, operator_client, sent, django_capture_on_commit_callbacks
):
    services.schedule_entry_save(
        capacity_set=h100,
        data=day_shift(deployments={}, rank_order=["h100-spot", "h100-ondemand"]),
        actor=operator,
        now=BEFORE,
    )
    boundary(h100, OPENS, django_capture_on_commit_callbacks)

    pools = {row["name"]: row for row in operator_api.get("/api/pools/").json()["results"]}
    summary = operator_api.get(f"/api/capacity-sets/{h100.pk}/").json()["pools"]
    page = operator_client.get(reverse("fleet:capacity-set-list")).content.decode()

    inference, spot = pools["h100-inference"], pools["h100-spot"]
    assert (inference["floor_gpus"], inference["floor_gpus_in_force"]) == (4, 8)
    assert (spot["rank"], spot["rank_in_force"]) == (3, 2)
    assert {row["name"]: row["rank_in_force"] for row in summary} == {
        "h100-inference": 1,
        "h100-spot": 2,
        "h100-ondemand": 3,
    }
    assert "Rank 2 from the set's schedule now; its own rank is 3" in page


@pytest.mark.django_db
def test_metrics_give_the_floor_and_replica_range_in_force(
    h100, chat, operator, scrape, sent, django_capture_on_commit_callbacks
):
    services.schedule_entry_save(capacity_set=h100, data=day_shift(), actor=operator, now=BEFORE)
    labels = {"pool": "h100-inference", "kind": "inference", "set": "h100-east"}
    before = scrape()
    assert before.value("gpucap_pool_floor_gpus", **labels) == 4
    assert before.value("gpucap_inference_replicas_min", deployment=SLUG) == 0

    boundary(h100, OPENS, django_capture_on_commit_callbacks)

    seen = scrape()
    assert seen.value("gpucap_pool_floor_gpus", **labels) == 8
    assert seen.value("gpucap_inference_replicas_min", deployment=SLUG) == 2
    assert seen.value("gpucap_inference_replicas_max", deployment=SLUG) == 2


# --- with a real worker, on a short clock --------------------------------------------------------


@pytest.fixture
def worker(workers, h100, sim, settings):
    """A real worker on this test database; a change waits one second for others before the
    set is planned."""
    settings.PLANS_DEBOUNCE_SECONDS = 1
    return workers(PLANS_DEBOUNCE_SECONDS="1", INFERENCE_REDIS_URL=TEST_INFERENCE_REDIS_URL)


@pytest.mark.django_db(transaction=True)
def test_the_worker_applies_a_boundary_at_its_moment_and_spot_vms_get_notices(
    worker, h100, full_set, chat, operator
):
    in_mode(h100, Mode.ENFORCE, operator)
    # A window that opens a few seconds from now (UTC, on the weekday it opens), for an hour.
    opens = (timezone.now() + timedelta(seconds=10)).replace(microsecond=0)
    soon = day_shift(
        days=[opens.weekday()],
        start=f"{opens:%H:%M:%S}",
        end=f"{opens + timedelta(hours=1):%H:%M:%S}",
        time_zone="UTC",
    )
    services.schedule_entry_save(capacity_set=h100, data=soon, actor=operator)
    # Saved before it opens: nothing is in force yet; the boundary is sent for its moment.
    assert not AuditEvent.objects.filter(verb="policy.apply").exists()
    chat.refresh_from_db()
    assert chat.min_replicas_in_force == 0

    applied = wait_for(
        lambda: AuditEvent.objects.filter(verb="policy.apply").first(),
        timeout=90,
        what="the worker to apply the boundary",
        log=worker.log,
    )
    assert applied.created_at >= opens
    assert applied.actor is None  # the worker's task for the moment, not the operator's save
    assert applied.message == (
        f"pool h100-inference floor 4 → 8 GPUs; deployment {SLUG} replicas 0-2 → 2-2"
    )
    wait_for(
        lambda: len(replicas(chat)) == 2,
        timeout=60,
        what="the autoscaler, woken by the boundary, to ask for two replicas",
        log=worker.log,
    )
    wait_for(
        lambda: noticed() == ["spot-3", "spot-4"],
        timeout=60,
        what="the enforced plan to notify spot-3 and spot-4",
        log=worker.log,
    )
    plan = Plan.objects.get(capacity_set=h100, status=Plan.Status.APPLIED)
    assert victims(plan) == ["spot-3", "spot-4"]
    assert plan.created_at >= applied.created_at  # made for the replicas the boundary asked for
    states = VirtualMachine.objects.filter(name__in=["spot-1", "spot-2"]).values_list(
        "state", flat=True
    )
    assert set(states) == {State.RUNNING}
    assert AuditEvent.objects.filter(verb="policy.apply").count() == 1
