"""The inference API, /api/deployments/ and /api/api-keys/: tenant-scoped reads, creating and
changing deployments through the services, keys whose secret appears once, revocation, and
errors in the one error shape. Another tenant's ids are a 404; a refused request changes
nothing."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.inference import cache, keys
from gpucap.inference import services as inference
from gpucap.inference.models import ApiKey, InferenceDeployment
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from gpucap.tenancy.models import Membership

State = VirtualMachine.State


@pytest.fixture
def globex_deployment(other_tenant, inference_pools):
    """A deployment of globex's in the standalone inference pool (opened to globex too)."""
    pool = inference_pools["standalone"]
    pool.tenants.add(other_tenant)
    return inference.deployment_create(
        tenant=other_tenant,
        pool=pool,
        name="secret-bot",
        model_name="globex/private-70b",
        gpus_per_replica=1,
        min_replicas=0,
    )


@pytest.fixture
def globex_key(other_tenant, globex_deployment) -> ApiKey:
    api_key, _secret = inference.api_key_create(
        tenant=other_tenant, name="globex prod", deployment=globex_deployment
    )
    return api_key


@pytest.fixture
def pcie_inference_pool(fleet_east, tenant):
    """An inference pool in the PCIe L40S set, open to acme."""
    pool = fleet.pool_create(
        name="l40s-inference",
        kind="inference",
        cluster=fleet_east["cluster"],
        capacity_set=fleet_east["sets"]["l40s-east"],
        rank=2,
    )
    fleet.pool_set_tenants(pool=pool, tenants=[tenant])
    return pool


def world() -> dict:
    """Everything a refused request must not change."""
    return {
        "deployments": list(InferenceDeployment.objects.order_by("pk").values()),
        "vms": list(
            VirtualMachine.objects.order_by("pk").values_list("pk", "deployment_id", "state")
        ),
        "keys": list(ApiKey.objects.order_by("pk").values()),
        "events": AuditEvent.objects.count(),
    }


def body(pool, **overrides) -> dict:
    return {
        "pool": pool.pk,
        "name": "chat",
        "model_name": "meta-llama/Llama-3.1-8B",
        "gpus_per_replica": 1,
        **overrides,
    }


def assert_invalid(response, field: str, reason: str) -> None:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert any(reason in message for message in error["fields"][field]), error
    assert field in error["message"]


def running_replica(deployment, index: int, *, url: str) -> VirtualMachine:
    """Place the deployment's pending replica number ``index`` on a100-001 and run it."""
    vm = deployment.replicas.order_by("pk")[index]
    node = deployment.pool.cluster.nodes.get(hostname="a100-001")
    rentals.vm_place(vm=vm, node=node, gpu_indices=[index])
    return rentals.vm_mark_running(vm=vm, ip_address=f"10.3.0.{index + 1}", endpoint_url=url)


# --- deployments: reads -----------------------------------------------------------------------


def test_anonymous_requests_are_refused_with_401(anonymous_api, deploy, inference_pools):
    deployment = deploy()
    api_key, _ = inference.api_key_create(tenant=deployment.tenant, name="prod")
    before = world()
    for response in (
        anonymous_api.get("/api/deployments/"),
        anonymous_api.get(f"/api/deployments/{deployment.pk}/"),
        anonymous_api.post("/api/deployments/", body(inference_pools["standalone"]), "json"),
        anonymous_api.patch(f"/api/deployments/{deployment.pk}/", {"max_replicas": 2}, "json"),
        anonymous_api.get("/api/api-keys/"),
        anonymous_api.get(f"/api/api-keys/{api_key.pk}/"),
        anonymous_api.post("/api/api-keys/", {"name": "x"}, "json"),
        anonymous_api.post(f"/api/api-keys/{api_key.pk}/revoke/"),
    ):
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "not_authenticated"
    assert world() == before


def test_a_member_lists_only_their_tenants_deployments(
    member_api, other_member_api, deploy, globex_deployment
):
    deploy("chat")
    deploy("embed", where="set")
    listed = member_api.get("/api/deployments/").json()
    assert [d["slug"] for d in listed["results"]] == ["acme-chat", "acme-embed"]
    theirs = other_member_api.get("/api/deployments/").json()
    assert (theirs["count"], theirs["results"][0]["slug"]) == (1, "globex-secret-bot")


def test_operators_list_every_deployment(operator_api, deploy, globex_deployment):
    deploy("chat")
    listed = operator_api.get("/api/deployments/").json()
    assert [d["slug"] for d in listed["results"]] == ["acme-chat", "globex-secret-bot"]


def test_filters_deployments_by_tenant_and_pool(
    operator_api, member_api, deploy, globex_deployment, inference_pools
):
    deploy("chat")
    deploy("embed", where="set")
    by_tenant = operator_api.get("/api/deployments/?tenant=globex").json()["results"]
    assert [d["slug"] for d in by_tenant] == ["globex-secret-bot"]
    by_pool = operator_api.get(f"/api/deployments/?pool={inference_pools['set'].pk}").json()
    assert [d["slug"] for d in by_pool["results"]] == ["acme-embed"]
    # A member filtering by another tenant learns nothing, not even that it exists.
    response = member_api.get("/api/deployments/?tenant=globex")
    assert (response.status_code, response.json()["count"]) == (200, 0)
    assert_invalid(member_api.get("/api/deployments/?pool=abc"), "pool", "whole number")


def test_a_deployment_shows_its_settings_replicas_and_live_queue(
    member_api, deploy, inference_redis
):
    deployment = deploy(
        "chat", min_replicas=2, max_replicas=4, target_in_flight=2, replica_concurrency=3
    )
    serving = running_replica(deployment, 0, url="http://10.3.0.1:8000")
    waiting = deployment.replicas.get(state=State.PENDING)
    inference_redis.set(cache.queued_key(deployment.slug), 5)
    inference_redis.hset(cache.inflight_key(deployment.slug), serving.instance_id, 3)

    shown = member_api.get(f"/api/deployments/{deployment.pk}/").json()

    assert (shown["tenant"], shown["slug"], shown["pool_name"], shown["model_name"]) == (
        "acme",
        "acme-chat",
        "a100-inference",
        "gpucap/sim-8b",
    )
    assert shown["base_url"] == "http://testserver/inference/acme-chat/v1"
    assert (
        shown["min_replicas"],
        shown["max_replicas"],
        shown["target_in_flight"],
        shown["replica_concurrency"],
    ) == (2, 4, 2, 3)
    assert (shown["queued"], shown["in_flight"]) == (5, 3)
    assert shown["replicas"] == [
        {
            "id": serving.pk,
            "instance_id": serving.instance_id,
            "state": "running",
            "node": "a100-001",
            "gpu_count": 1,
            "endpoint_url": "http://10.3.0.1:8000",
            "started_at": shown["replicas"][0]["started_at"],
            "readiness": {
                "status": "waiting",
                "label": "waiting for first probe",
                "last_probe_at": None,
                "consecutive_failures": 0,
                "last_error": "",
            },
            "in_flight": 3,
        },
        {
            "id": waiting.pk,
            "instance_id": waiting.instance_id,
            "state": "pending",
            "node": None,
            "gpu_count": 1,
            "endpoint_url": None,
            "started_at": None,
            "readiness": {
                "status": None,
                "label": "",
                "last_probe_at": None,
                "consecutive_failures": 0,
                "last_error": "",
            },
            "in_flight": 0,
        },
    ]
    assert shown["replicas"][0]["started_at"]
    # Running, but its model server has not answered a probe: the router sends it nothing.
    assert shown["ready_replicas"] == 0


def test_the_list_shows_each_deployments_queue_and_leaves_out_terminated_replicas(
    member_api, deploy, inference_redis
):
    chat = deploy("chat", min_replicas=1, max_replicas=3)
    deploy("embed", min_replicas=0)
    inference.replicas_scale(deployment=chat, to=3, reason="burst")
    inference.replicas_scale(deployment=chat, to=1, reason="quiet")
    inference_redis.set(cache.queued_key("acme-chat"), 7)

    rows = {d["slug"]: d for d in member_api.get("/api/deployments/").json()["results"]}

    assert (rows["acme-chat"]["queued"], rows["acme-chat"]["in_flight"]) == (7, 0)
    assert (rows["acme-embed"]["queued"], rows["acme-embed"]["replicas"]) == (0, [])
    assert [r["state"] for r in rows["acme-chat"]["replicas"]] == ["pending"]
    assert chat.replicas.filter(state=State.TERMINATED).count() == 2


def test_deployments_still_answer_when_the_routers_redis_is_down(member_api, deploy, settings):
    deploy("chat")
    settings.INFERENCE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    for response in (
        member_api.get("/api/deployments/"),
        member_api.get(f"/api/deployments/{InferenceDeployment.objects.get().pk}/"),
    ):
        assert response.status_code == 200
        shown = response.json()["results"][0] if "results" in response.json() else response.json()
        assert (shown["queued"], shown["in_flight"]) == (None, None)
        assert [r["in_flight"] for r in shown["replicas"]] == [None]


def test_deployment_list_runs_a_fixed_number_of_queries(
    operator_api, member_api, deploy, globex_deployment, django_assert_num_queries
):
    deploy("d0", min_replicas=2, max_replicas=2)
    operator_api.get("/api/deployments/")  # the first request caches the user's role
    member_api.get("/api/deployments/")  # ... and the member's tenants
    # count, deployments (with tenant and pool), replicas (with node).
    with django_assert_num_queries(3):
        assert operator_api.get("/api/deployments/").json()["count"] == 2
    with django_assert_num_queries(3):
        assert member_api.get("/api/deployments/").json()["count"] == 1
    for number in range(1, 5):
        deploy(f"d{number}", where="set" if number % 2 else "standalone", min_replicas=1)
    with django_assert_num_queries(3):
        assert operator_api.get("/api/deployments/").json()["count"] == 6
    with django_assert_num_queries(3):
        assert member_api.get("/api/deployments/").json()["count"] == 5


# --- deployments: create ----------------------------------------------------------------------


def test_a_member_creates_a_deployment(member_api, member, tenant, inference_pools):
    response = member_api.post(
        "/api/deployments/",
        body(inference_pools["set"], gpus_per_replica=2, min_replicas=2, max_replicas=4),
        format="json",
    )
    assert response.status_code == 201, response.content
    shown = response.json()
    assert (shown["tenant"], shown["slug"], shown["gpus_per_replica"]) == ("acme", "acme-chat", 2)
    assert [(r["state"], r["gpu_count"]) for r in shown["replicas"]] == [("pending", 2)] * 2
    deployment = InferenceDeployment.objects.get(pk=shown["id"])
    assert (deployment.tenant, deployment.created_by, deployment.queue_limit) == (
        tenant,
        member,
        64,
    )
    assert AuditEvent.objects.filter(
        verb="deployment.create", object_id=str(deployment.pk), actor_label="mallory"
    ).exists()


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        (
            {"min_replicas": 3, "max_replicas": 2},
            "min_replicas",
            "exceed the maximum of 2 replicas",
        ),
        ({"max_replicas": 0}, "max_replicas", "from 1 to 64"),
        ({"gpus_per_replica": 3}, "gpus_per_replica", "3 GPUs is not an NVLink partition size"),
        ({"gpus_per_replica": 16}, "gpus_per_replica", "16 GPUs is not an NVLink partition"),
        (
            {"target_in_flight": 8, "replica_concurrency": 4},
            "replica_concurrency",
            "must be at least target_in_flight (8)",
        ),
        ({"queue_limit": -1}, "queue_limit", "from 0 to 100000"),
        ({"cold_start_timeout_seconds": 0}, "cold_start_timeout_seconds", "from 1 to 3600"),
        ({"cold_start_timeout_seconds": "soon"}, "cold_start_timeout_seconds", "valid integer"),
        ({"gpus_per_replica": "two"}, "gpus_per_replica", "valid integer"),
        ({"name": "Has Spaces"}, "name", "lowercase letters, digits or hyphens"),
        ({"model_name": ""}, "model_name", "may not be blank"),
        ({"slug": "mine"}, "slug", "is chosen by gpucap"),
        ({"warp_speed": 9}, "warp_speed", "cannot be set by this request"),
    ],
)
def test_bad_deployment_input_is_a_400_naming_the_field_and_creates_nothing(
    member_api, inference_pools, overrides, field, reason
):
    before = world()
    response = member_api.post(
        "/api/deployments/", body(inference_pools["standalone"], **overrides), format="json"
    )
    assert_invalid(response, field, reason)
    assert world() == before


def test_a_pcie_pool_takes_one_gpu_per_replica(member_api, pcie_inference_pool):
    before = world()
    response = member_api.post(
        "/api/deployments/", body(pcie_inference_pool, gpus_per_replica=2), format="json"
    )
    assert_invalid(response, "gpus_per_replica", "PCIe sets allocate single cards")
    assert world() == before
    response = member_api.post("/api/deployments/", body(pcie_inference_pool), format="json")
    assert response.status_code == 201


def test_a_deployment_needs_an_inference_pool_the_tenant_may_use(
    member_api, fleet_east, inference_pools
):
    pools = fleet_east["pools"]
    before = world()
    # A spot pool acme may use: the service explains why it will not do.
    assert_invalid(
        member_api.post("/api/deployments/", body(pools["h100-spot"]), format="json"),
        "pool",
        "is a spot pool; deployments need an inference pool",
    )
    # A pool nobody granted acme, and no pool at all: no hint which exists.
    for pool_id in (pools["h100-ondemand"].pk, pools["l40s-ondemand"].pk, 999999):
        response = member_api.post(
            "/api/deployments/", {**body(pools["h100-spot"]), "pool": pool_id}, format="json"
        )
        assert_invalid(response, "pool", f"no pool {pool_id} that your tenant may use")
    assert world() == before


def test_an_inference_pool_of_another_tenant_is_refused(other_member_api, inference_pools, deploy):
    deploy("chat")
    before = world()
    response = other_member_api.post(
        "/api/deployments/", body(inference_pools["set"]), format="json"
    )
    assert_invalid(response, "pool", "that your tenant may use")
    assert world() == before


def test_a_name_is_unique_per_tenant(member_api, deploy, inference_pools):
    deploy("chat")
    before = world()
    response = member_api.post(
        "/api/deployments/", body(inference_pools["standalone"]), format="json"
    )
    assert_invalid(response, "name", "already has a deployment named 'chat'")
    assert world() == before


def test_a_member_cannot_deploy_for_a_tenant_they_are_not_in(
    member_api, other_tenant, inference_pools
):
    inference_pools["standalone"].tenants.add(other_tenant)
    before = world()
    response = member_api.post(
        "/api/deployments/", body(inference_pools["standalone"], tenant="globex"), format="json"
    )
    assert_invalid(response, "tenant", "no tenant globex that you may deploy for")
    assert world() == before


def test_a_member_of_several_tenants_names_the_tenant(
    member_api, member, other_tenant, inference_pools
):
    Membership.objects.create(user=member, tenant=other_tenant)
    member_api.force_authenticate(member)  # forget the cached tenants
    pool = inference_pools["standalone"]
    before = world()
    assert_invalid(
        member_api.post("/api/deployments/", body(pool), format="json"),
        "tenant",
        "you are a member of several tenants (acme, globex)",
    )
    # globex may not use the pool: the service names the tenant and the pool.
    assert_invalid(
        member_api.post("/api/deployments/", body(pool, tenant="globex"), format="json"),
        "pool",
        "tenant globex may not use pool a100-inference",
    )
    assert world() == before
    response = member_api.post("/api/deployments/", body(pool, tenant="acme"), format="json")
    assert (response.status_code, response.json()["tenant"]) == (201, "acme")


def test_operators_who_are_not_members_deploy_for_no_tenant(
    operator_api, operator, inference_pools
):
    pool = inference_pools["standalone"]
    before = world()
    assert_invalid(
        operator_api.post("/api/deployments/", body(pool), format="json"),
        "tenant",
        "operators must name the tenant to deploy for",
    )
    assert world() == before
    # #16: an operator who is not a member looks at a tenant read-only.
    response = operator_api.post("/api/deployments/", body(pool, tenant="acme"), format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert "read-only" in response.json()["error"]["message"]
    assert world() == before


# --- deployments: update, and what is not allowed ---------------------------------------------


def test_a_member_changes_the_range_and_replicas_follow_at_once(member_api, deploy):
    deployment = deploy("chat", min_replicas=1, max_replicas=2)
    response = member_api.patch(
        f"/api/deployments/{deployment.pk}/",
        {"min_replicas": 3, "max_replicas": 6, "queue_limit": 10, "cold_start_timeout_seconds": 90},
        format="json",
    )
    assert response.status_code == 200, response.content
    shown = response.json()
    assert (shown["min_replicas"], shown["max_replicas"], shown["queue_limit"]) == (3, 6, 10)
    assert shown["cold_start_timeout_seconds"] == 90
    assert len(shown["replicas"]) == 3
    deployment.refresh_from_db()
    assert (deployment.min_replicas, deployment.max_replicas) == (3, 6)
    assert AuditEvent.objects.filter(
        verb="deployment.update", object_id=str(deployment.pk), actor_label="mallory"
    ).exists()


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"min_replicas": 5}, "min_replicas", "must not exceed the maximum of 2 replicas, got 5"),
        ({"max_replicas": 65}, "max_replicas", "from 1 to 64"),
        ({"cold_start_timeout_seconds": 3601}, "cold_start_timeout_seconds", "from 1 to 3600"),
        ({"replica_concurrency": 1}, "replica_concurrency", "at least target_in_flight (4)"),
        ({"min_replicas": "two"}, "min_replicas", "valid integer"),
        ({"min_replicas": None}, "min_replicas", "may not be null"),
        ({"gpus_per_replica": 2}, "gpus_per_replica", "cannot be changed once a deployment"),
        ({"pool": 1}, "pool", "cannot be changed once a deployment"),
        ({"model_name": "other"}, "model_name", "cannot be changed once a deployment"),
        ({"name": "renamed"}, "name", "cannot be changed once a deployment"),
        ({"tenant": "globex"}, "tenant", "cannot be changed once a deployment"),
        ({"scale_down_since": None}, "scale_down_since", "cannot be set by this request"),
    ],
)
def test_a_bad_update_is_a_400_naming_the_field_and_changes_nothing(
    member_api, deploy, changes, field, reason
):
    deployment = deploy("chat", min_replicas=1, max_replicas=2)
    before = world()
    response = member_api.patch(f"/api/deployments/{deployment.pk}/", changes, format="json")
    assert_invalid(response, field, reason)
    assert world() == before


def test_deployments_are_not_replaced_or_deleted_through_the_api(member_api, operator_api, deploy):
    deployment = deploy("chat")
    before = world()
    for client in (member_api, operator_api):
        url = f"/api/deployments/{deployment.pk}/"
        response = client.delete(url)
        assert (response.status_code, response.json()["error"]["code"]) == (
            405,
            "method_not_allowed",
        )
        assert client.put(url, body(deployment.pool), format="json").status_code == 405
    assert world() == before


def test_another_tenants_deployment_is_a_404(member_api, globex_deployment):
    url = f"/api/deployments/{globex_deployment.pk}/"
    before = world()
    for response in (
        member_api.get(url),
        member_api.patch(url, {"max_replicas": 9}, format="json"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
        assert "secret-bot" not in response.content.decode()
    assert world() == before


def test_operators_change_no_tenants_deployment(operator_api, operator, globex_deployment):
    before = world()
    response = operator_api.patch(
        f"/api/deployments/{globex_deployment.pk}/", {"max_replicas": 3}, format="json"
    )
    assert response.status_code == 403
    assert world() == before


# --- API keys ---------------------------------------------------------------------------------


def test_a_keys_secret_is_in_the_create_answer_and_nowhere_else(member_api, member, deploy):
    deployment = deploy("chat")
    response = member_api.post(
        "/api/api-keys/", {"name": "prod", "deployment": deployment.pk}, format="json"
    )
    assert response.status_code == 201, response.content
    assert response["Cache-Control"] == "no-store"
    created = response.json()
    secret = created["key"]
    prefix, body_ = keys.key_parse(secret)
    api_key = ApiKey.objects.get(pk=created["id"])
    assert (created["prefix"], api_key.prefix) == (prefix, prefix)
    assert keys.key_matches(salt=api_key.salt, digest=api_key.digest, secret=body_)
    assert (created["tenant"], created["deployment"], created["deployment_slug"]) == (
        "acme",
        deployment.pk,
        "acme-chat",
    )
    assert (created["status"], created["created_by"]) == ("active", "mallory")
    assert "salt" not in created and "digest" not in created

    for later in (
        member_api.get("/api/api-keys/"),
        member_api.get(f"/api/api-keys/{api_key.pk}/"),
        member_api.post(f"/api/api-keys/{api_key.pk}/revoke/"),
    ):
        assert later.status_code == 200
        text = later.content.decode()
        assert body_ not in text and api_key.salt not in text and api_key.digest not in text
        shown = later.json()
        assert "key" not in (shown["results"][0] if "results" in shown else shown)
    listed = member_api.get("/api/api-keys/").json()["results"]
    assert [(k["name"], k["prefix"]) for k in listed] == [("prod", prefix)]


def test_a_key_for_every_deployment_of_the_tenant(member_api, tenant, deploy):
    deploy("chat")
    response = member_api.post("/api/api-keys/", {"name": "all", "deployment": None}, "json")
    assert response.status_code == 201, response.content
    assert (response.json()["tenant"], response.json()["deployment"]) == ("acme", None)
    assert ApiKey.objects.get(pk=response.json()["id"]).deployment is None


def test_a_key_naming_a_deployment_is_for_that_deployments_tenant(
    member_api, member, other_tenant, deploy
):
    Membership.objects.create(user=member, tenant=other_tenant)
    member_api.force_authenticate(member)
    deployment = deploy("chat")
    response = member_api.post(
        "/api/api-keys/", {"name": "prod", "deployment": deployment.pk}, format="json"
    )
    assert (response.status_code, response.json()["tenant"]) == (201, "acme")


def test_a_key_that_expires(member_api, deploy):
    deploy("chat")
    expires = timezone.now() + timedelta(days=30)
    response = member_api.post(
        "/api/api-keys/", {"name": "trial", "expires_at": expires.isoformat()}, format="json"
    )
    assert response.status_code == 201
    api_key = ApiKey.objects.get(pk=response.json()["id"])
    assert api_key.expires_at == expires
    ApiKey.objects.filter(pk=api_key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert member_api.get(f"/api/api-keys/{api_key.pk}/").json()["status"] == "expired"


@pytest.mark.parametrize(
    ("payload", "field", "reason"),
    [
        ({"name": ""}, "name", "may not be blank"),
        ({"name": "x" * 101}, "name", "no more than 100 characters"),
        ({"name": "p", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at", "in the future"),
        ({"name": "p", "expires_at": "soon"}, "expires_at", "Datetime has wrong format"),
        ({"name": "p", "deployment": 999999}, "deployment", "no deployment 999999 of your tenants"),
        ({"name": "p", "tenant": "globex"}, "tenant", "no tenant globex that you may create"),
        ({"name": "p", "prefix": "aaaaaaaaaa"}, "prefix", "is generated by gpucap"),
        ({"name": "p", "key": "gpk_x"}, "key", "is generated by gpucap"),
    ],
)
def test_bad_key_input_is_a_400_naming_the_field_and_creates_nothing(
    member_api, deploy, payload, field, reason
):
    deploy("chat")
    before = world()
    assert_invalid(member_api.post("/api/api-keys/", payload, format="json"), field, reason)
    assert world() == before


def test_a_key_for_another_tenants_deployment_is_refused(
    member_api, other_member_api, deploy, globex_deployment
):
    deploy("chat")
    before = world()
    response = member_api.post(
        "/api/api-keys/", {"name": "steal", "deployment": globex_deployment.pk}, format="json"
    )
    assert_invalid(response, "deployment", f"no deployment {globex_deployment.pk} of your tenants")
    response = other_member_api.post(
        "/api/api-keys/", {"name": "steal", "tenant": "acme"}, format="json"
    )
    assert_invalid(response, "tenant", "no tenant acme that you may create API keys for")
    assert world() == before


def test_revoking_a_key_reaches_the_router_and_is_harmless_twice(
    member_api, tenant, deploy, inference_redis, django_capture_on_commit_callbacks
):
    deploy("chat")
    api_key, _secret = inference.api_key_create(tenant=tenant, name="prod")
    with django_capture_on_commit_callbacks(execute=True):
        response = member_api.post(f"/api/api-keys/{api_key.pk}/revoke/")
    assert response.status_code == 200
    assert (response.json()["status"], bool(response.json()["revoked_at"])) == ("revoked", True)
    document = json.loads(inference_redis.get(cache.api_key_key(api_key.prefix)))
    assert document["revoked"] is True
    assert AuditEvent.objects.filter(verb="api_key.revoke", actor_label="mallory").count() == 1

    again = member_api.post(f"/api/api-keys/{api_key.pk}/revoke/")
    assert (again.status_code, again.json()["revoked_at"]) == (200, response.json()["revoked_at"])
    assert AuditEvent.objects.filter(verb="api_key.revoke").count() == 1


def test_keys_filter_by_revoked_and_deployment(member_api, tenant, deploy):
    chat = deploy("chat")
    inference.api_key_create(tenant=tenant, name="kept", deployment=chat)
    gone, _ = inference.api_key_create(tenant=tenant, name="gone")
    inference.api_key_revoke(api_key=gone)

    def names(query: str) -> list[str]:
        return [k["name"] for k in member_api.get(f"/api/api-keys/?{query}").json()["results"]]

    assert names("revoked=true") == ["gone"]
    assert names("revoked=false") == ["kept"]
    assert names(f"deployment={chat.pk}") == ["kept"]
    assert names("all_deployments=true") == ["gone"]


def test_another_tenants_key_is_a_404_and_never_listed(
    member_api, operator_api, deploy, tenant, globex_key
):
    deploy("chat")
    inference.api_key_create(tenant=tenant, name="acme prod")
    before = world()
    for response in (
        member_api.get(f"/api/api-keys/{globex_key.pk}/"),
        member_api.post(f"/api/api-keys/{globex_key.pk}/revoke/"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
        assert globex_key.prefix not in response.content.decode()
    assert world() == before
    assert [k["name"] for k in member_api.get("/api/api-keys/").json()["results"]] == ["acme prod"]
    assert member_api.get("/api/api-keys/?tenant=globex").json()["count"] == 0
    every = {k["name"] for k in operator_api.get("/api/api-keys/").json()["results"]}
    assert every == {"acme prod", "globex prod"}


def test_keys_are_not_edited_or_deleted_through_the_api(member_api, tenant, deploy):
    deploy("chat")
    api_key, _ = inference.api_key_create(tenant=tenant, name="prod")
    before = world()
    url = f"/api/api-keys/{api_key.pk}/"
    assert member_api.patch(url, {"name": "renamed"}, format="json").status_code == 405
    assert member_api.delete(url).status_code == 405
    assert world() == before


def test_key_list_runs_a_fixed_number_of_queries(
    operator_api, member_api, tenant, deploy, globex_key, django_assert_num_queries
):
    chat = deploy("chat")
    inference.api_key_create(tenant=tenant, name="k0", deployment=chat)
    operator_api.get("/api/api-keys/")
    member_api.get("/api/api-keys/")
    # count, keys (with tenant, deployment and creator).
    with django_assert_num_queries(2):
        assert operator_api.get("/api/api-keys/").json()["count"] == 2
    with django_assert_num_queries(2):
        assert member_api.get("/api/api-keys/").json()["count"] == 1
    for number in range(1, 5):
        inference.api_key_create(
            tenant=tenant, name=f"k{number}", deployment=chat if number % 2 else None
        )
    with django_assert_num_queries(2):
        assert operator_api.get("/api/api-keys/").json()["count"] == 6
    with django_assert_num_queries(2):
        assert member_api.get("/api/api-keys/").json()["count"] == 5


# --- the replica image from the catalogue -------------------------------------------------------


def test_a_deployment_runs_its_replicas_on_a_replica_image_of_the_catalogue(
    member_api, inference_pools, fleet_east
):
    fleet.image_create(
        cluster=fleet_east["cluster"],
        name="vllm-0.6-openai",
        base_image="/var/lib/gpucap/images/vllm.qcow2",
        default_user="ubuntu",
        ports=[8000],
    )
    pool = inference_pools["standalone"]
    response = member_api.post(
        "/api/deployments/", body(pool, image="vllm-0.6-openai"), format="json"
    )
    assert response.status_code == 201, response.content
    assert response.json()["image"] == "vllm-0.6-openai"
    replicas = VirtualMachine.objects.filter(deployment_id=response.json()["id"])
    assert {vm.image for vm in replicas} == {"vllm-0.6-openai"}


def test_an_image_that_serves_no_port_is_no_replica_image(member_api, inference_pools):
    before = world()
    response = member_api.post(
        "/api/deployments/",
        body(inference_pools["standalone"], image="ubuntu-24.04-cuda-12.6"),
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["image"] == [
        "'ubuntu-24.04-cuda-12.6' is not a replica image offered for pool a100-inference; "
        "choose one of: gpucap-model-server"
    ]
    assert world() == before


def test_without_an_image_a_deployment_runs_gpucaps_model_server(deploy):
    deployment = deploy()
    assert deployment.image == "gpucap-model-server"
    assert {vm.image for vm in deployment.replicas.all()} == {"gpucap-model-server"}
