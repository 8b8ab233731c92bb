"""/metrics as a Prometheus server reads it: parsed with prometheus_client's text parser, the
fleet's gauges match the database, counters count plans, Celery failures and metadata requests,
only operators and the bearer token get in, and a scrape costs the same queries at any size."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpucap.celery import app
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet, Gpu
from gpucap.inference import services as inference
from gpucap.notices import cache
from gpucap.notices.metadata import metadata_app
from gpucap.notices.models import InterruptionNotice
from gpucap.notices.services import notice_issue
from gpucap.plans import services as plans
from gpucap.plans.models import Plan
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from gpucap.usage import services as usage
from tests.conftest import TEST_METADATA_REDIS_URL, run_in_new_loop
from tests.metrics.conftest import Scrape
from tests.rentals.vm_helpers import request_vm, running_vm

Reason = InterruptionNotice.Reason
SCRAPE_QUERIES = 8


# --- the fleet's gauges --------------------------------------------------------------------------


@pytest.fixture
def small_fleet(fleet_east, tenant, other_tenant, operator, sent_tasks):
    """fleet_east with VMs in several states, a notice of each kind that has a beneficiary or
    not, a failed GPU, a cordoned node and an inference deployment with one ready replica."""
    pools, nodes = fleet_east["pools"], fleet_east["nodes"]
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[other_tenant])
    spot_1 = running_vm(
        tenant, pools["h100-spot"], nodes["h100-001"], [0, 1, 2, 3], name="spot-1", ip="10.0.0.1"
    )
    spot_2 = running_vm(
        tenant, pools["h100-spot"], nodes["h100-002"], [0, 2], name="spot-2", ip="10.0.0.2"
    )
    request_vm(tenant, pools["h100-spot"], name="spot-3", gpu_count=1)
    train = request_vm(other_tenant, pools["h100-ondemand"], name="train", gpu_count=8)
    # spot-1 stops for train (its GPUs are reserved for it); spot-2 is reclaimed by an operator.
    notice_issue(vm=spot_1, reason=Reason.ARBITER, preempted_for=train)
    notice_issue(vm=spot_2, reason=Reason.RECLAIM, actor=operator)
    running_vm(
        other_tenant, pools["l40s-ondemand"], nodes["l40s-001"], [0], name="l40s", ip="10.0.0.3"
    )
    fleet.node_cordon(node=nodes["l40s-002"])
    fleet.gpu_set_health(gpu=Gpu.objects.get(node=nodes["h100-002"], index=7), health="failed")

    standalone = fleet.pool_create(
        name="a100-inference",
        kind="inference",
        cluster=fleet_east["cluster"],
        rank=2,
        gpu_model="A100-SXM4-80GB",
        fabric="nvswitch",
    )
    fleet.pool_set_tenants(pool=standalone, tenants=[tenant])
    chat = inference.deployment_create(
        tenant=tenant,
        pool=standalone,
        name="chat",
        model_name="gpucap/sim-8b",
        gpus_per_replica=1,
        min_replicas=2,
        max_replicas=4,
    )
    replica = chat.replicas.order_by("pk").first()
    if replica.state == VirtualMachine.State.PENDING:
        replica = rentals.vm_place(vm=replica, node=nodes["a100-001"], gpu_indices=[0])
    replica = rentals.vm_mark_running(
        vm=replica, ip_address="10.0.0.4", endpoint_url="http://10.0.0.4:80"
    )
    # Its model server answered the readiness probe (recorded as the prober records it: nothing
    # listens at that address here, and no test sends traffic to it).
    inference.replica_probe_record(
        vm_id=replica.pk,
        endpoint_url=replica.endpoint_url,
        seen_at=None,
        ok=True,
        at=replica.started_at,
    )
    return fleet_east


def test_gpus_of_each_set_by_state_add_up_to_the_set(small_fleet, scrape):
    seen = scrape()

    def gpus(capacity_set: str) -> dict:
        return {
            state: seen.value("gpucap_gpus", cluster="east", set=capacity_set, state=state)
            for state in ("free", "held", "reserved", "failed", "unavailable")
        }

    # h100-east: spot-1's 4 GPUs stop for train, spot-2 (notice without a beneficiary) holds 2,
    # one card failed.
    assert gpus("h100-east") == {"free": 9, "held": 2, "reserved": 4, "failed": 1, "unavailable": 0}
    # l40s-east: one VM, and l40s-002 cordoned.
    assert gpus("l40s-east") == {"free": 3, "held": 1, "reserved": 0, "failed": 0, "unavailable": 4}
    # The standalone A100 node: a set-less place, the replicas it holds.
    standalone = gpus("")
    assert sum(standalone.values()) == 8 and standalone["held"] >= 1
    assert seen.value("gpucap_capacity_set_enforcing", set="h100-east") == 0


def test_pools_show_held_pending_and_floor(small_fleet, scrape):
    seen = scrape()

    def pool(name: str, kind: str, capacity_set: str) -> tuple:
        labels = {"pool": name, "kind": kind, "set": capacity_set}
        return (
            seen.value("gpucap_pool_gpus_held", **labels),
            seen.value("gpucap_pool_gpus_reserved", **labels),
            seen.value("gpucap_pool_pending_gpus", **labels),
            seen.value("gpucap_pool_floor_gpus", **labels),
        )

    # (held, reserved for it, pending, floor): spot-1's 4 GPUs are spot's until it stops, and
    # reserved for train, on-demand's pending VM.
    assert pool("h100-spot", "spot", "h100-east") == (6, 0, 1, 0)
    assert pool("h100-ondemand", "on_demand", "h100-east") == (0, 4, 8, 0)
    assert pool("h100-inference", "inference", "h100-east") == (0, 0, 0, 4)
    assert pool("l40s-ondemand", "on_demand", "l40s-east") == (1, 0, 0, 0)
    held, _, pending, _ = pool("a100-inference", "inference", "")
    assert held + pending == 2  # the deployment's two replicas, placed or waiting


def test_notices_vms_and_replicas(small_fleet, scrape):
    seen = scrape()
    assert seen.value("gpucap_notices_open", reason="arbiter") == 1
    assert seen.value("gpucap_notices_open", reason="reclaim") == 1
    assert seen.value("gpucap_notices_open", reason="drain") == 0
    assert seen.value("gpucap_vms", state="notified", kind="spot") == 2
    assert seen.value("gpucap_vms", state="pending", kind="spot") == 1
    assert seen.value("gpucap_vms", state="pending", kind="on_demand") == 1
    assert seen.value("gpucap_vms", state="running", kind="on_demand") == 1
    assert seen.value("gpucap_vms", state="terminated", kind="spot") == 0
    assert seen.total("gpucap_vms", kind="inference") == 2
    assert seen.value("gpucap_inference_replicas_ready", deployment="acme-chat") == 1
    assert seen.value("gpucap_inference_replicas_target", deployment="acme-chat") == 2
    assert seen.value("gpucap_inference_replicas_min", deployment="acme-chat") == 2
    assert seen.value("gpucap_inference_replicas_max", deployment="acme-chat") == 4


def test_usage_records_waiting_for_the_billing_webhook(small_fleet, scrape, operator):
    assert "gpucap_billing_records_waiting" not in scrape().families  # no webhook configured
    made = usage.usage_record(now=timezone.now() + timedelta(hours=3))
    assert made > 0
    usage.billing_webhook_configure(
        url="https://billing.example/usage",
        secret="s" * 32,
        enabled=True,
        batch_size=100,
        actor=operator,
    )
    seen = scrape()
    assert seen.value("gpucap_billing_records_waiting") == made
    assert seen.value("gpucap_billing_webhook_enabled") == 1
    assert seen.value("gpucap_billing_webhook_consecutive_failures") == 0


def test_a_scrape_costs_the_same_queries_at_two_fleet_sizes(
    fleet_east, tenant, client, metrics_token, django_assert_num_queries, sent_tasks
):
    headers = {"Authorization": f"Bearer {metrics_token}"}
    with django_assert_num_queries(SCRAPE_QUERIES):
        assert client.get("/metrics", headers=headers).status_code == 200

    # Ten times the nodes, a second set, VMs in every pool.
    cluster = fleet_east["cluster"]
    more = fleet.capacity_set_create(
        cluster=cluster, name="h200-east", gpu_model="H200", fabric="nvswitch"
    )
    pool = fleet.pool_create(
        name="h200-spot", kind="spot", cluster=cluster, capacity_set=more, rank=1
    )
    fleet.pool_set_tenants(pool=pool, tenants=[tenant])
    for n in range(40):
        node = fleet.node_create(
            cluster=cluster,
            hostname=f"h200-{n:03}",
            gpu_model="H200",
            fabric="nvswitch",
            gpu_count=8,
        )
        node = fleet.node_join_set(node=node, capacity_set=more)
        running_vm(tenant, pool, node, [0, 1], name=f"spot-{n}", ip=f"10.1.0.{n + 1}")
        request_vm(tenant, pool, name=f"waiting-{n}", gpu_count=2)
    with django_assert_num_queries(SCRAPE_QUERIES):
        seen = Scrape(client.get("/metrics", headers=headers).content.decode())
    assert seen.value("gpucap_gpus", cluster="east", set="h200-east", state="held") == 80
    assert (
        seen.value("gpucap_pool_pending_gpus", pool="h200-spot", kind="spot", set="h200-east") == 80
    )


# --- counters ------------------------------------------------------------------------------------


def test_plans_made_and_applied_are_counted_and_pruning_does_not_lower_them(
    fleet_east,
    tenant,
    other_tenant,
    operator,
    scrape,
    sent_tasks,
    django_capture_on_commit_callbacks,
):
    h100, l40s = fleet_east["sets"]["h100-east"], fleet_east["sets"]["l40s-east"]
    pools = fleet_east["pools"]
    assert scrape().value("gpucap_plans_made_total", set="h100-east", mode="enforce") == 0

    with django_capture_on_commit_callbacks(execute=True):
        plans.capacity_set_set_mode(
            capacity_set=h100, mode=CapacitySet.Mode.ENFORCE, actor=operator
        )
        for name in ("spot-1", "spot-2"):
            request_vm(tenant, pools["h100-spot"], name=name, gpu_count=4)
            tick = plans.capacity_set_tick(capacity_set_id=h100.pk)
            assert tick.applied
        # l40s-east stays in dry-run: its plan is applied when an operator approves it.
        request_vm(other_tenant, pools["l40s-ondemand"], name="infer", gpu_count=1)
        plan = plans.plan_make(capacity_set=l40s)
        plans.plan_approve(plan=plan, actor=operator)

    seen = scrape()
    assert seen.value("gpucap_plans_made_total", set="h100-east", mode="enforce") == 2
    assert seen.value("gpucap_plans_applied_total", set="h100-east", mode="enforce") == 2
    assert seen.value("gpucap_plans_made_total", set="l40s-east", mode="dry_run") == 1
    assert seen.value("gpucap_plans_applied_total", set="l40s-east", mode="dry_run") == 1
    assert seen.value("gpucap_plans_applied_total", set="h100-east", mode="dry_run") == 0

    assert plans.plans_prune(keep=0) >= 2
    assert not Plan.objects.filter(capacity_set=h100).exists()
    again = scrape()
    assert again.value("gpucap_plans_made_total", set="h100-east", mode="enforce") == 2
    assert again.value("gpucap_plans_applied_total", set="h100-east", mode="enforce") == 2


def test_replans_with_nothing_to_do_are_counted_as_folded_not_as_made(
    fleet_east, operator, scrape, sent_tasks, django_capture_on_commit_callbacks
):
    h100 = fleet_east["sets"]["h100-east"]
    node = fleet_east["nodes"]["h100-001"]
    assert scrape().value("gpucap_plans_folded_total", set="h100-east") == 0
    with django_capture_on_commit_callbacks(execute=True):
        first = plans.capacity_set_tick(capacity_set_id=h100.pk).plan
        for _ in range(2):
            fleet.node_cordon(node=node, actor=operator)
            fleet.node_uncordon(node=node, actor=operator)
            assert plans.capacity_set_tick(capacity_set_id=h100.pk).plan == first
    seen = scrape()
    assert seen.value("gpucap_plans_made_total", set="h100-east", mode="dry_run") == 1
    assert seen.value("gpucap_plans_folded_total", set="h100-east") == 2


def test_a_refused_apply_is_not_counted_as_applied(
    fleet_east, tenant, operator, scrape, sent_tasks, django_capture_on_commit_callbacks
):
    h100 = fleet_east["sets"]["h100-east"]
    with django_capture_on_commit_callbacks(execute=True):
        request_vm(tenant, fleet_east["pools"]["h100-spot"], name="spot-1", gpu_count=4)
        seen_plan = plans.plan_make(capacity_set=h100)
        request_vm(tenant, fleet_east["pools"]["h100-spot"], name="spot-2", gpu_count=4)
        with pytest.raises(plans.StalePlan):
            plans.plan_approve(plan=seen_plan, actor=operator)
    seen = scrape()
    assert seen.value("gpucap_plans_made_total", set="h100-east", mode="dry_run") == 2
    assert seen.value("gpucap_plans_applied_total", set="h100-east", mode="dry_run") == 0


@app.task(name="tests.metrics.always_fails")
def always_fails() -> None:
    raise RuntimeError("the driver said no")


@app.task(name="tests.metrics.retries_once", bind=True, max_retries=1, default_retry_delay=0)
def retries_once(self) -> None:
    raise self.retry(exc=RuntimeError("try again"))


@app.task(name="tests.metrics.polls_once", bind=True, max_retries=1, default_retry_delay=0)
def polls_once(self, polls: int = 0) -> None:
    if polls == 0:
        raise self.retry(kwargs={"polls": 1})  # look again later, as the driver tasks do


def test_a_task_polling_again_is_not_counted_as_a_retry(scrape):
    before = scrape().value("gpucap_celery_task_retries_total", task="tests.metrics.polls_once")

    assert polls_once.apply().successful()

    after = scrape().value("gpucap_celery_task_retries_total", task="tests.metrics.polls_once")
    assert (after or 0) == (before or 0)


def test_celery_task_failures_and_retries_are_counted_by_task(scrape):
    for _ in range(2):
        assert always_fails.apply().failed()
    # Eager retries run at once: the first run asks for its one retry, which fails for good.
    assert retries_once.apply().failed()
    seen = scrape()
    failures = "gpucap_celery_task_failures_total"
    assert seen.value(failures, task="tests.metrics.always_fails") == 2
    assert seen.value("gpucap_celery_task_retries_total", task="tests.metrics.retries_once") == 1
    assert seen.value(failures, task="tests.metrics.retries_once") == 1
    # Every registered task is listed from zero, so its first failure shows as an increase.
    assert seen.value(failures, task="plans.tick_all") == 0


def test_shared_counters_say_when_redis_cannot_be_read(scrape, monkeypatch):
    import redis

    from gpucap import metrics

    unreachable = redis.Redis.from_url("redis://127.0.0.1:1/0")
    monkeypatch.setattr(metrics, "shared_counters_redis", lambda: unreachable)
    seen = scrape()
    assert seen.value("gpucap_shared_counters_up") == 0
    assert "gpucap_plans_made" not in seen.families
    assert "gpucap_notices_open" in seen.families  # the database's part still answers


def guest_request(method: str, path: str, headers: dict | None = None, query: bytes = b"") -> int:
    """One request to the metadata endpoint's ASGI app, as uvicorn hands it over."""
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": query,
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": ("10.77.0.1", 40000),
    }
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    run_in_new_loop(lambda: metadata_app(scope, receive, send))
    return sent[0]["status"]


def test_metadata_requests_are_counted_by_flavour_and_status(
    scrape, settings, metadata_test_redis, monkeypatch
):
    settings.METADATA_REDIS_URL = TEST_METADATA_REDIS_URL
    monkeypatch.setattr(cache, "KEY_PREFIX", "gpucap:imds:metrics-test:ip:")
    before = scrape()

    def count(flavour: str, code: str) -> float:
        return before.value("gpucap_metadata_requests_total", flavour=flavour, code=code) or 0

    assert guest_request("GET", "/latest/meta-data/spot/instance-action") == 401
    assert guest_request("GET", "/computeMetadata/v1/instance/preempted") == 403
    for _ in range(3):
        assert guest_request("GET", "/metadata/v1/interruption") == 404  # no VM at the address
    after = scrape()
    for flavour, code, more in (("ec2", "401", 1), ("gcp", "403", 1), ("native", "404", 3)):
        labels = {"flavour": flavour, "code": code}
        assert (
            after.value("gpucap_metadata_requests_total", **labels) == count(flavour, code) + more
        )
    timed = after.value("gpucap_metadata_request_duration_seconds_count", flavour="native")
    assert (
        timed
        == (before.value("gpucap_metadata_request_duration_seconds_count", flavour="native") or 0)
        + 3
    )


# --- who may read it -----------------------------------------------------------------------------


def test_anonymous_is_refused_with_401_and_learns_nothing(client, fleet_east):
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"gpucap_" not in response.content and b"h100" not in response.content


def test_a_tenant_member_is_refused_with_403(client, member, fleet_east):
    client.force_login(member)
    response = client.get("/metrics")
    assert response.status_code == 403
    assert b"gpucap_" not in response.content


def test_an_operator_reads_the_metrics(client, operator, fleet_east):
    client.force_login(operator)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert b"gpucap_gpus{" in response.content


def test_the_bearer_token_reads_the_metrics(client, metrics_token):
    response = client.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
    assert response.status_code == 200


@pytest.mark.parametrize("token", ["wrong-token-0123456789abcdef", "", "x" * 200])
def test_a_wrong_token_is_refused_with_401(client, metrics_token, operator, token):
    client.force_login(operator)  # a session does not rescue a wrong token
    response = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert b"gpucap_" not in response.content


def test_without_a_configured_token_no_token_gets_in(client, settings):
    settings.METRICS_TOKEN = ""
    response = client.get("/metrics", headers={"Authorization": "Bearer "})
    assert response.status_code == 401


def test_metrics_are_read_only(client, metrics_token):
    response = client.post("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
    assert response.status_code == 405
