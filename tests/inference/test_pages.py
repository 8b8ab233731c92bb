"""The inference pages: a tenant's deployments with the create form, one deployment with its
replicas, range, API keys and client snippets, and every deployment for operators. Another
tenant's deployments and keys are 404s; a refused form changes nothing and says why next to
the field it is about; a key's secret is shown once and never again."""

import datetime
import re
import time

import pytest
import redis
from django.urls import reverse
from django.utils import timezone

from gpucap.fleet import services as fleet
from gpucap.inference import cache, keys, selectors
from gpucap.inference import services as inference
from gpucap.inference.models import ApiKey, InferenceDeployment
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from gpucap.tenancy.models import Membership

HTMX = {"HX-Request": "true"}
SECRET = re.compile(r"gpk_[A-Za-z0-9]{10}_[A-Za-z0-9]{40}")


def tenant_url(slug: str = "acme") -> str:
    return reverse("inference:tenant-deployments", kwargs={"slug": slug})


def detail_url(deployment: InferenceDeployment) -> str:
    return reverse(
        "inference:deployment-detail",
        kwargs={"slug": deployment.tenant.slug, "name": deployment.name},
    )


def settings_url(deployment: InferenceDeployment) -> str:
    return reverse(
        "inference:deployment-update",
        kwargs={"slug": deployment.tenant.slug, "name": deployment.name},
    )


def key_create_url(deployment: InferenceDeployment) -> str:
    return reverse(
        "inference:key-create", kwargs={"slug": deployment.tenant.slug, "name": deployment.name}
    )


def key_revoke_url(deployment: InferenceDeployment, api_key: ApiKey) -> str:
    return reverse(
        "inference:key-revoke",
        kwargs={"slug": deployment.tenant.slug, "name": deployment.name, "pk": api_key.pk},
    )


def create_form(pool, **overrides) -> dict:
    return {
        "name": "chat",
        "model_name": "meta-llama/Llama-3.1-8B-Instruct",
        "pool": pool.pk,
        "gpus_per_replica": 2,
        "min_replicas": 1,
        "max_replicas": 3,
        "target_in_flight": 4,
        "replica_concurrency": 8,
        "queue_limit": 64,
        "scale_down_cooldown_seconds": 300,
        "cold_start_timeout_seconds": 300,
        **overrides,
    }


def settings_form(deployment, **overrides) -> dict:
    return {
        name: getattr(deployment, name)
        for name in (
            "min_replicas",
            "max_replicas",
            "target_in_flight",
            "replica_concurrency",
            "queue_limit",
            "scale_down_cooldown_seconds",
            "cold_start_timeout_seconds",
        )
    } | overrides


def field_error(page: str, field: str) -> str:
    """The error shown right under a form field."""
    match = re.search(rf'<p class="field-error" id="id_{field}-error">([^<]*)</p>', page)
    assert match, f"no error shown next to {field}"
    return match[1]


def world() -> dict:
    """Everything a refused request must not change."""
    return {
        "deployments": list(InferenceDeployment.objects.order_by("pk").values()),
        "keys": list(ApiKey.objects.order_by("pk").values()),
        "vms": list(VirtualMachine.objects.order_by("pk").values_list("pk", "state")),
    }


def router_counters(slug: str, *, queued: int, in_flight: dict, answered: dict[int, int]) -> None:
    """Set what the router's counters would hold: ``answered`` maps seconds ago -> requests."""
    client = cache.inference_redis()
    client.set(cache.queued_key(slug), queued)
    if in_flight:
        client.hset(cache.inflight_key(slug), mapping=in_flight)
    now = int(time.time())
    for ago, count in answered.items():
        client.set(cache.requests_key(slug, now - ago), count)


def running_replica(deployment, node, gpus: list[int], *, endpoint: str) -> VirtualMachine:
    vm = deployment.replicas.filter(state="pending").order_by("pk").first()
    rentals.vm_place(vm=vm, node=node, gpu_indices=gpus)
    return rentals.vm_mark_running(vm=vm, ip_address="10.30.0.5", endpoint_url=endpoint)


@pytest.fixture
def globex_deployment(other_tenant, inference_pools, tenant):
    fleet.pool_set_tenants(pool=inference_pools["set"], tenants=[tenant, other_tenant])
    return inference.deployment_create(
        tenant=other_tenant,
        pool=inference_pools["set"],
        name="secret-model",
        model_name="globex/private-70b",
        gpus_per_replica=8,
    )


# --- who may see what --------------------------------------------------------------------------


def test_anonymous_visitor_is_sent_to_login(client, deploy):
    deployment = deploy()
    for url in (reverse("inference:deployment-list"), tenant_url(), detail_url(deployment)):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"] == f"{reverse('login')}?next={url}"


def test_the_inference_nav_takes_a_member_to_their_tenants_deployments(member_client, deploy):
    deploy()
    response = member_client.get(reverse("inference:deployment-list"))
    assert response.status_code == 302 and response["Location"] == tenant_url("acme")
    page = member_client.get(tenant_url()).content.decode()
    nav = f'<a href="{reverse("inference:deployment-list")}" aria-current="page">Inference</a>'
    assert nav in page


def test_a_member_of_several_tenants_picks_whose_deployments(member_client, member, other_tenant):
    Membership.objects.create(user=member, tenant=other_tenant)
    page = member_client.get(reverse("inference:deployment-list")).content.decode()
    assert "Whose deployments?" in page
    assert f'href="{tenant_url("acme")}"' in page and f'href="{tenant_url("globex")}"' in page


def test_another_tenants_deployments_and_keys_are_404_on_every_url(
    other_member_client, deploy, tenant, inference_pools
):
    deployment = deploy()
    api_key, _ = inference.api_key_create(tenant=tenant, name="prod", deployment=deployment)
    before = world()
    gets = [tenant_url("acme"), detail_url(deployment)]
    posts = {
        tenant_url("acme"): create_form(inference_pools["standalone"], name="stolen"),
        settings_url(deployment): settings_form(deployment, max_replicas=5),
        key_create_url(deployment): {"name": "mine now", "scope": "tenant"},
        key_revoke_url(deployment, api_key): {},
    }
    for url in gets:
        for headers in ({}, HTMX):
            response = other_member_client.get(url, headers=headers)
            assert response.status_code == 404, url
            assert "gpucap/sim-8b" not in response.content.decode()
    for url, data in posts.items():
        for headers in ({}, HTMX):
            assert other_member_client.post(url, data, headers=headers).status_code == 404, url
    assert world() == before


def test_a_key_of_another_deployment_cannot_be_revoked_through_this_one(
    member_client, deploy, tenant
):
    chat, embed = deploy("chat"), deploy("embed")
    embed_key, _ = inference.api_key_create(tenant=tenant, name="embed", deployment=embed)
    response = member_client.post(key_revoke_url(chat, embed_key), headers=HTMX)
    assert response.status_code == 404
    embed_key.refresh_from_db()
    assert embed_key.revoked_at is None


def test_a_tenants_page_never_shows_another_tenants_deployments(
    member_client, deploy, globex_deployment
):
    deploy()
    page = member_client.get(tenant_url()).content.decode()
    assert ">chat</a>" in page
    assert "secret-model" not in page and "globex/private-70b" not in page


# --- my deployments ----------------------------------------------------------------------------


def test_my_deployments_shows_replicas_queue_depth_requests_and_router_url(
    member_client, deploy, inference_pools
):
    deployment = deploy(min_replicas=2, max_replicas=4)
    router_counters(
        deployment.slug,
        queued=3,
        in_flight={"vm-1": 2, "vm-2": 1},
        # 25 requests in the last 10 whole seconds: 2.5/s. Older ones are not counted.
        answered={2: 10, 4: 10, 6: 5, 30: 1000},
    )
    response = member_client.get(tenant_url())
    page = response.content.decode()
    row = re.search(rf'<tr id="deployment-{deployment.pk}".*?</tr>', page, re.S)[0]
    assert f'href="{detail_url(deployment)}"' in row and "gpucap/sim-8b" in row
    assert "<code>http://testserver/inference/acme-chat/v1</code>" in row
    assert "a100-inference" in row and "standalone" in row
    assert '<strong>2</strong> <span class="muted">of 2..4</span>' in row
    assert '<span class="vm-state vm-state-pending">2 pending</span>' in row
    assert "<strong>6</strong>" in row and "3 queued · 3 in flight" in row
    assert '<td class="num requests-per-second">2.5</td>' in row
    # The live part polls every 5 s and refreshes at once after a create.
    assert 'hx-trigger="every 5s, deployments-changed from:body"' in page


def test_replica_states_are_counted_separately(member_client, deploy, fleet_east):
    deployment = deploy(min_replicas=3, max_replicas=3)
    running_replica(
        deployment, fleet_east["nodes"]["a100-001"], [0], endpoint="http://10.30.0.5:8000"
    )
    row = selectors.tenant_deployments(tenant=deployment.tenant).rows[0]
    assert row.live == 3
    assert [(c.state, c.count) for c in row.states] == [("pending", 2), ("running", 1)]


def test_the_live_list_answers_an_htmx_poll_with_only_its_fragment(member_client, deploy):
    deploy()
    response = member_client.get(tenant_url(), headers=HTMX)
    fragment = response.content.decode()
    assert response.status_code == 200
    assert fragment.lstrip().startswith('<section class="panel" id="deployments-live"')
    assert "<html" not in fragment and "Create a deployment" not in fragment
    assert ">chat</a>" in fragment


def test_a_page_says_when_the_routers_counters_cannot_be_read(member_client, deploy, settings):
    deploy()
    settings.INFERENCE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    page = member_client.get(tenant_url()).content.decode()
    assert "The router's counters could not be read" in page
    assert ">chat</a>" in page


# --- creating a deployment ---------------------------------------------------------------------


def test_a_member_creates_a_deployment_through_the_form(member_client, member, inference_pools):
    pool = inference_pools["standalone"]
    response = member_client.post(tenant_url(), create_form(pool), headers=HTMX)

    assert response.status_code == 200
    assert response["HX-Trigger"] == "deployments-changed"
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<section class="panel" id="deployment-create"')
    assert 'role="status">Created <a href="/tenants/acme/inference/chat/">chat</a>' in fragment
    deployment = InferenceDeployment.objects.get()
    assert (deployment.tenant.slug, deployment.pool, deployment.slug) == ("acme", pool, "acme-chat")
    assert (deployment.model_name, deployment.gpus_per_replica) == (
        "meta-llama/Llama-3.1-8B-Instruct",
        2,
    )
    assert (deployment.min_replicas, deployment.max_replicas, deployment.created_by) == (
        1,
        3,
        member,
    )
    assert [vm.state for vm in deployment.replicas.all()] == ["pending"]


def test_creating_without_htmx_goes_to_the_new_deployment(member_client, inference_pools):
    response = member_client.post(tenant_url(), create_form(inference_pools["set"]))
    assert response.status_code == 302
    assert response["Location"] == "/tenants/acme/inference/chat/"


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"name": "Chat Bot"}, "name", "must be 1-63 lowercase letters, digits or hyphens"),
        ({"name": ""}, "name", "This field is required."),
        ({"model_name": ""}, "model_name", "This field is required."),
        ({"model_name": "   "}, "model_name", "This field is required."),
        ({"pool": "spot"}, "pool", "is not an inference pool your tenant may use"),
        ({"pool": "globex-only"}, "pool", "is not an inference pool your tenant may use"),
        ({"gpus_per_replica": 3}, "gpus_per_replica", "whole partitions of 1, 2, 4 or 8 GPUs"),
        ({"gpus_per_replica": "two"}, "gpus_per_replica", "Enter a whole number."),
        (
            {"min_replicas": 5, "max_replicas": 2},
            "min_replicas",
            "exceed the maximum of 2 replicas",
        ),
        ({"max_replicas": 0}, "max_replicas", "must be a whole number from 1 to 64, got 0"),
        ({"max_replicas": 65}, "max_replicas", "must be a whole number from 1 to 64, got 65"),
        ({"target_in_flight": 0}, "target_in_flight", "from 1 to 1000, got 0"),
        (
            {"target_in_flight": 8, "replica_concurrency": 4},
            "replica_concurrency",
            "must be at least target_in_flight (8), got 4",
        ),
        ({"queue_limit": -1}, "queue_limit", "from 0 to 100000, got -1"),
        ({"scale_down_cooldown_seconds": "soon"}, "scale_down_cooldown_seconds", "whole number"),
        ({"scale_down_cooldown_seconds": 90000}, "scale_down_cooldown_seconds", "0 to 86400"),
        ({"cold_start_timeout_seconds": 0}, "cold_start_timeout_seconds", "1 to 3600, got 0"),
    ],
)
def test_a_refused_deployment_names_the_field_and_creates_nothing(
    member_client, inference_pools, fleet_east, other_tenant, overrides, field, message
):
    globex_only = fleet.pool_create(
        name="globex-inference",
        kind="inference",
        cluster=fleet_east["cluster"],
        rank=5,
        gpu_model="A100-SXM4-80GB",
        fabric="nvswitch",
    )
    fleet.pool_set_tenants(pool=globex_only, tenants=[other_tenant])
    pools = {"spot": fleet_east["pools"]["h100-spot"].pk, "globex-only": globex_only.pk}
    data = create_form(inference_pools["standalone"]) | overrides
    data["pool"] = pools.get(data["pool"], data["pool"])
    before = world()

    response = member_client.post(tenant_url(), data, headers=HTMX)

    assert response.status_code == 400
    assert message in field_error(response.content.decode(), field)
    assert world() == before


def test_a_taken_name_is_refused_next_to_the_name(member_client, deploy, inference_pools):
    deploy("chat")
    before = world()
    response = member_client.post(
        tenant_url(), create_form(inference_pools["standalone"]), headers=HTMX
    )
    assert response.status_code == 400
    assert "already has a deployment named &#x27;chat&#x27;" in field_error(
        response.content.decode(), "name"
    )
    assert world() == before


def test_the_form_offers_only_inference_pools_the_tenant_may_use(member_client, inference_pools):
    page = member_client.get(tenant_url()).content.decode()
    select = re.search(r'<select name="pool".*?</select>', page, re.S)[0]
    assert re.findall(r'<option value="\d+"[^>]*>([^ ]+) ·', select) == [
        "h100-inference",
        "a100-inference",
    ]


def test_an_operator_sees_a_tenants_deployments_read_only(operator_client, deploy, inference_pools):
    deploy()
    page = operator_client.get(tenant_url()).content.decode()
    assert ">chat</a>" in page and "Operator view · read-only" in page
    assert "Create a deployment" not in page
    before = world()
    response = operator_client.post(
        tenant_url(), create_form(inference_pools["standalone"], name="ops"), headers=HTMX
    )
    assert response.status_code == 403
    assert world() == before


# --- one deployment ----------------------------------------------------------------------------


def test_the_detail_lists_replicas_with_their_vm_node_gpus_and_endpoint(
    member_client, deploy, fleet_east
):
    deployment = deploy(min_replicas=2, max_replicas=2, gpus_per_replica=2)
    vm = running_replica(
        deployment, fleet_east["nodes"]["a100-001"], [2, 3], endpoint="http://10.30.0.5:8000"
    )
    router_counters(deployment.slug, queued=0, in_flight={vm.instance_id: 3}, answered={})
    page = member_client.get(detail_url(deployment)).content.decode()

    row = re.search(rf'<tr id="replica-{vm.pk}".*?</tr>', page, re.S)[0]
    assert f'<a href="{reverse("rentals:vm-detail", kwargs={"pk": vm.pk})}"' in row
    assert f">{vm.name}</a>" in row and 'vm-state-running">Running' in row
    assert "a100-001" in row and '<span class="gpu-indices">2,3</span>' in row
    assert '<code class="endpoint">http://10.30.0.5:8000</code>' in row
    assert "ago</span>" in row and '<td class="num">3</td>' in row
    pending = deployment.replicas.get(state="pending")
    assert (
        "waiting for capacity"
        in re.search(rf'<tr id="replica-{pending.pk}".*?</tr>', page, re.S)[0]
    )


def test_the_detail_shows_the_curl_and_openai_snippets_with_the_router_url(member_client, deploy):
    deployment = deploy()
    page = member_client.get(detail_url(deployment)).content.decode()
    base = "http://testserver/inference/acme-chat/v1"
    assert f"curl {base}/chat/completions" in page
    assert "Authorization: Bearer $GPUCAP_API_KEY" in page
    assert f'OpenAI(base_url="{base}", api_key=os.environ["GPUCAP_API_KEY"])' in page
    assert 'model="gpucap/sim-8b"' in page
    assert 'export GPUCAP_API_KEY="gpk_…your key…"' in page


def test_the_detail_poll_answers_with_only_the_live_part(member_client, deploy, tenant):
    deployment = deploy()
    inference.api_key_create(tenant=tenant, name="prod", deployment=deployment)
    response = member_client.get(detail_url(deployment), headers=HTMX)
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<div id="deployment-live"')
    assert 'hx-trigger="every 5s, deployment-changed from:body"' in fragment
    assert "<html" not in fragment and "API keys" not in fragment and "prod" not in fragment


def test_a_member_edits_the_range(member_client, member, deploy):
    deployment = deploy(min_replicas=1, max_replicas=2)
    page = member_client.get(detail_url(deployment)).content.decode()
    assert "requests wait up to 5 min for a replica to start" in page
    response = member_client.post(
        settings_url(deployment),
        settings_form(
            deployment,
            min_replicas=2,
            max_replicas=5,
            queue_limit=10,
            cold_start_timeout_seconds=90,
        ),
        headers=HTMX,
    )
    assert response.status_code == 200
    assert response["HX-Trigger"] == "deployment-changed"
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<section class="panel" id="deployment-settings"')
    assert 'role="status">Saved.' in fragment
    assert 'name="max_replicas" value="5"' in fragment
    deployment.refresh_from_db()
    assert (deployment.min_replicas, deployment.max_replicas, deployment.queue_limit) == (2, 5, 10)
    # Raising the minimum asks for the missing replica at once.
    assert deployment.replicas.filter(state="pending").count() == 2
    assert deployment.cold_start_timeout_seconds == 90
    page = member_client.get(detail_url(deployment)).content.decode()
    assert "requests wait up to 1 min 30 s for a replica to start" in page


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        (
            {"min_replicas": 4, "max_replicas": 2},
            "min_replicas",
            "exceed the maximum of 2 replicas",
        ),
        ({"max_replicas": 100}, "max_replicas", "from 1 to 64, got 100"),
        ({"queue_limit": ""}, "queue_limit", "This field is required."),
    ],
)
def test_a_refused_edit_names_the_field_and_changes_nothing(
    member_client, deploy, overrides, field, message
):
    deployment = deploy(min_replicas=1, max_replicas=2)
    before = world()
    response = member_client.post(
        settings_url(deployment), settings_form(deployment, **overrides), headers=HTMX
    )
    assert response.status_code == 400
    assert "HX-Trigger" not in response
    assert message in field_error(response.content.decode(), field)
    assert world() == before


def test_an_operator_sees_the_range_but_cannot_edit_it(operator_client, deploy):
    deployment = deploy(max_replicas=1)
    page = operator_client.get(detail_url(deployment)).content.decode()
    assert settings_url(deployment) not in page
    assert "deployment-settings-read-only" in page
    before = world()
    response = operator_client.post(
        settings_url(deployment), settings_form(deployment, max_replicas=3), headers=HTMX
    )
    assert response.status_code == 403
    assert world() == before


# --- API keys ----------------------------------------------------------------------------------


def test_a_created_key_is_shown_once_and_never_again(member_client, member, deploy):
    deployment = deploy()
    response = member_client.post(
        key_create_url(deployment), {"name": "prod", "scope": "deployment"}, headers=HTMX
    )

    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<div id="api-keys"')
    secret = SECRET.search(fragment)[0]
    assert f'<code class="secret" id="new-key-secret">{secret}</code>' in fragment
    assert "this is the only time it is shown" in fragment
    # The snippet carries the new key, ready to paste.
    assert f'export GPUCAP_API_KEY="{secret}"' in fragment
    api_key = ApiKey.objects.get()
    prefix, body = keys.key_parse(secret)
    assert (api_key.prefix, api_key.deployment, api_key.created_by) == (prefix, deployment, member)
    assert keys.key_matches(salt=api_key.salt, digest=api_key.digest, secret=body)

    for headers in ({}, HTMX):
        page = member_client.get(detail_url(deployment), headers=headers).content.decode()
        assert secret not in page and body not in page
    page = member_client.get(detail_url(deployment)).content.decode()
    row = re.search(rf'<tr id="key-{api_key.pk}".*?</tr>', page, re.S)[0]
    assert f"<code>gpk_{prefix}_…</code>" in row and "this deployment" in row
    assert "Active" in row and "never" in row


def test_last_used_says_how_often_it_is_brought_up_to_date(member_client, deploy, settings):
    """The router's record of a key's use reaches the key by the inference.keys_flush beat
    task, every INFERENCE_KEYS_FLUSH_SECONDS: "never" just after a use is not a fault."""
    flush = settings.CELERY_BEAT_SCHEDULE["inference-keys-flush"]
    assert flush["schedule"] == settings.INFERENCE_KEYS_FLUSH_SECONDS == 60
    deployment = deploy()
    page = member_client.get(detail_url(deployment)).content.decode()
    assert "last-used-hint" not in page  # no key, nothing to explain
    member_client.post(key_create_url(deployment), {"name": "prod", "scope": "deployment"})
    settings.INFERENCE_KEYS_FLUSH_SECONDS = 120
    page = member_client.get(detail_url(deployment)).content.decode()
    hint = re.search(r'<p class="small muted last-used-hint">([^<]*)</p>', page)[1]
    assert "brought up to date every 120 s" in hint and "say never" in hint


def test_a_created_key_without_htmx_is_shown_on_the_page_once(member_client, deploy):
    deployment = deploy()
    response = member_client.post(key_create_url(deployment), {"name": "prod", "scope": "tenant"})
    assert response.status_code == 200 and "<html" in response.content.decode()
    secret = SECRET.search(response.content.decode())[0]
    assert secret not in member_client.get(detail_url(deployment)).content.decode()


def test_a_key_for_all_deployments_is_listed_on_each(member_client, deploy):
    chat, embed = deploy("chat"), deploy("embed")
    member_client.post(key_create_url(chat), {"name": "everywhere", "scope": "tenant"})
    api_key = ApiKey.objects.get()
    assert api_key.deployment is None
    for deployment in (chat, embed):
        page = member_client.get(detail_url(deployment)).content.decode()
        row = re.search(rf'<tr id="key-{api_key.pk}".*?</tr>', page, re.S)[0]
        assert "all deployments" in row


def test_a_key_may_expire(member_client, deploy):
    deployment = deploy()
    tomorrow = timezone.now().date() + datetime.timedelta(days=1)
    response = member_client.post(
        key_create_url(deployment),
        {"name": "trial", "scope": "deployment", "expires_on": tomorrow.isoformat()},
        headers=HTMX,
    )
    assert response.status_code == 200
    expected = datetime.datetime.combine(tomorrow, datetime.time(), tzinfo=datetime.UTC)
    assert ApiKey.objects.get().expires_at == expected


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"name": "", "scope": "deployment"}, "name", "This field is required."),
        ({"name": "x" * 101, "scope": "deployment"}, "name", "at most 100 characters"),
        ({"name": "prod", "scope": "galaxy"}, "scope", "Select a valid choice."),
        ({"name": "prod", "scope": "tenant", "expires_on": "2001-01-01"}, "expires_on", "future"),
        ({"name": "prod", "scope": "tenant", "expires_on": "soon"}, "expires_on", "not a date"),
    ],
)
def test_a_refused_key_names_the_field_and_creates_nothing(
    member_client, deploy, data, field, message
):
    deployment = deploy()
    before = world()
    response = member_client.post(key_create_url(deployment), data, headers=HTMX)
    assert response.status_code == 400
    page = response.content.decode()
    assert message in field_error(page, field)
    assert not SECRET.search(page)
    assert world() == before


def test_a_member_revokes_a_key_after_confirming(member_client, member, deploy, tenant):
    deployment = deploy()
    api_key, secret = inference.api_key_create(tenant=tenant, name="prod", deployment=deployment)
    page = member_client.get(detail_url(deployment)).content.decode()
    form = re.search(rf'<form[^>]*action="{key_revoke_url(deployment, api_key)}"[^>]*>', page)[0]
    assert f'hx-confirm="Revoke key prod (gpk_{api_key.prefix}_…)?' in form

    response = member_client.post(key_revoke_url(deployment, api_key), headers=HTMX)

    assert response.status_code == 200
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<div id="api-keys"')
    assert "Revoked <strong>prod</strong>" in fragment and secret not in fragment
    row = re.search(rf'<tr id="key-{api_key.pk}".*?</tr>', fragment, re.S)[0]
    assert "key-status-revoked" in row and "Revoke</button>" not in row
    api_key.refresh_from_db()
    assert api_key.revoked_at is not None
    # Twice is harmless.
    assert member_client.post(key_revoke_url(deployment, api_key), headers=HTMX).status_code == 200


def test_an_operator_neither_creates_nor_revokes_a_key(operator_client, deploy, tenant):
    deployment = deploy()
    api_key, _ = inference.api_key_create(tenant=tenant, name="leaked", deployment=deployment)
    page = operator_client.get(detail_url(deployment)).content.decode()
    assert "Create an API key" not in page and "Revoke</button>" not in page
    assert "leaked" in page  # listed, read-only
    before = world()
    response = operator_client.post(
        key_create_url(deployment), {"name": "ops", "scope": "tenant"}, headers=HTMX
    )
    assert response.status_code == 403
    assert (
        operator_client.post(key_revoke_url(deployment, api_key), headers=HTMX).status_code == 403
    )
    assert world() == before


# --- every deployment (operators) --------------------------------------------------------------


def test_the_operator_page_lists_every_tenants_deployments_per_pool(
    operator_client, deploy, globex_deployment
):
    chat = deploy("chat", where="standalone")
    embed = deploy("embed", where="set")
    router_counters(globex_deployment.slug, queued=7, in_flight={"vm-9": 2}, answered={1: 30})
    page = operator_client.get(reverse("inference:deployment-list")).content.decode()

    bodies = re.findall(r'<section class="panel pool-deployments"[^>]*>(.*?)</section>', page, re.S)
    sections = {
        re.search(r'<span class="pool-name">([^<]+)</span>', body)[1]: body for body in bodies
    }
    # The set's pool first (rank order inside sets), then the standalone pool.
    assert list(sections) == ["h100-inference", "a100-inference"]
    assert ">embed</a>" in sections["h100-inference"]
    assert ">secret-model</a>" in sections["h100-inference"]
    assert (
        "Globex Research" in sections["h100-inference"] and "Acme AI" in sections["h100-inference"]
    )
    assert ">chat</a>" in sections["a100-inference"]
    assert (
        "set <a href" in sections["h100-inference"]
        and "standalone on east" in sections["a100-inference"]
    )
    globex_row = re.search(rf'<tr id="deployment-{globex_deployment.pk}".*?</tr>', page, re.S)[0]
    assert "<strong>9</strong>" in globex_row and "7 queued · 2 in flight" in globex_row
    assert '<td class="num requests-per-second">3.0</td>' in globex_row
    assert f'href="{detail_url(chat)}"' in page and f'href="{detail_url(embed)}"' in page
    nav = f'<a href="{reverse("inference:deployment-list")}" aria-current="page">Inference</a>'
    assert nav in page


def test_the_operator_page_polls_its_live_part(operator_client, deploy):
    deploy()
    response = operator_client.get(reverse("inference:deployment-list"), headers=HTMX)
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<div id="inference-live"')
    assert 'hx-trigger="every 5s"' in fragment and "<html" not in fragment
    assert ">chat</a>" in fragment


# --- fixed costs -------------------------------------------------------------------------------


def many(deploy, count: int) -> list[InferenceDeployment]:
    existing = InferenceDeployment.objects.count()
    return [deploy(f"model-{existing + n}", max_replicas=2) for n in range(count - existing)]


def test_my_deployments_runs_a_fixed_number_of_queries(
    member_client, deploy, django_assert_num_queries
):
    many(deploy, 1)
    # session, user; memberships, tenant; deployments with replica counts; pools and replica
    # images for the form.
    with django_assert_num_queries(7):
        member_client.get(tenant_url())
    many(deploy, 5)
    with django_assert_num_queries(7):
        response = member_client.get(tenant_url())
    assert len(response.context["listing"].rows) == 5


def test_the_operator_page_runs_a_fixed_number_of_queries(
    operator_client, deploy, globex_deployment, django_assert_num_queries
):
    # session, user, operator group; deployments with their pools and replica counts.
    with django_assert_num_queries(4):
        operator_client.get(reverse("inference:deployment-list"))
    many(deploy, 5)
    with django_assert_num_queries(4):
        response = operator_client.get(reverse("inference:deployment-list"))
    assert len(response.context["fleet"].rows) == 5


def test_the_detail_runs_a_fixed_number_of_queries(
    member_client, deploy, tenant, django_assert_num_queries
):
    deployment = deploy(min_replicas=1, max_replicas=8)
    inference.api_key_create(tenant=tenant, name="one", deployment=deployment)
    # session, user; memberships; deployment with counts; replicas, their GPUs; keys.
    with django_assert_num_queries(7):
        member_client.get(detail_url(deployment))
    inference.replicas_scale(deployment=deployment, to=5, reason="test")
    for n in range(4):
        inference.api_key_create(tenant=tenant, name=f"k{n}", deployment=None)
    with django_assert_num_queries(7):
        response = member_client.get(detail_url(deployment))
    assert len(response.context["replicas"]) == 5 and len(response.context["keys"]) == 5


@pytest.fixture
def redis_round_trips(monkeypatch, inference_redis):
    """How many times the pages talk to the inference Redis database (a pipeline is one)."""
    sent = []
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(connection, command, *args, **kwargs):
        if connection.db == inference_redis.connection_pool.connection_kwargs["db"]:
            sent.append(command)
        return original(connection, command, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    return sent


@pytest.mark.parametrize("count", [1, 5])
def test_the_load_of_every_deployment_on_a_page_is_one_redis_round_trip(
    member_client, operator_client, deploy, redis_round_trips, count
):
    many(deploy, count)
    for client, url in ((member_client, tenant_url()), (operator_client, "/deployments/")):
        redis_round_trips.clear()
        response = client.get(url)
        assert response.status_code == 200
        assert len(redis_round_trips) == 1, url


def test_deployment_loads_reads_the_routers_counters(deploy):
    chat, embed = deploy("chat"), deploy("embed")
    router_counters(chat.slug, queued=2, in_flight={"vm-1": 1, "vm-2": 4}, answered={3: 12})
    now = time.time()
    loads = selectors.deployment_loads([chat.slug, embed.slug, chat.slug], now=now)
    assert loads[chat.slug] == selectors.Load(
        queued=2, in_flight=5, per_replica={"vm-1": 1, "vm-2": 4}, requests_per_second=1.2
    )
    assert loads[chat.slug].queue_depth == 7
    assert loads[embed.slug] == selectors.Load(0, 0, {}, 0.0)
    assert selectors.deployment_loads([]) == {}
