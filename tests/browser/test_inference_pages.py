"""The inference pages in a real browser: a tenant member creates a deployment through the form
(a refused one first), watches its replicas and load, changes its range, creates an API key and
sees its secret once, finds it in the client snippet, and revokes it through the confirmation
dialog; an operator sees every tenant's deployments per pool. No Celery worker runs here: the
test moves a replica along through the services and sets the router's counters, as a worker and
the router would."""

import os
import re
import time

import pytest
from playwright.sync_api import expect

from gpucap.fleet import services as fleet
from gpucap.inference import cache
from gpucap.inference import services as inference
from gpucap.inference.models import ApiKey, InferenceDeployment
from gpucap.redis_clients import keys_delete
from gpucap.rentals import services as rentals
from tests.browser.conftest import log_in, screenshot
from tests.inference import conftest as inference_fixtures

pytestmark = pytest.mark.django_db(transaction=True)
inference_pools = inference_fixtures.inference_pools
# The router's documents and counters go to a Redis database of this module's own: the
# inference tests empty theirs (tests/inference/conftest.py) before and after each test, and a
# run of them alongside would wipe the counters these pages are watching.
BROWSER_INFERENCE_REDIS = os.environ.get(
    "TEST_BROWSER_INFERENCE_REDIS_URL", "redis://127.0.0.1:6379/12"
)


@pytest.fixture(autouse=True)
def inference_redis(settings):
    settings.INFERENCE_REDIS_URL = BROWSER_INFERENCE_REDIS
    client = cache.inference_redis()
    keys_delete(client, f"{cache.PREFIX}*")
    client.set(cache.synced_key(), "0")  # synced, with nothing in it: the test database is empty
    yield client
    keys_delete(client, f"{cache.PREFIX}*")


SECRET = re.compile(r"^gpk_[A-Za-z0-9]{10}_[A-Za-z0-9]{40}$")


def router_counters(slug: str, *, queued: int, in_flight: dict, per_second: int) -> None:
    """What the router's counters would hold under a steady load of ``per_second``."""
    client = cache.inference_redis()
    client.set(cache.queued_key(slug), queued)
    client.hset(cache.inflight_key(slug), mapping=in_flight)
    now = int(time.time())
    for ago in range(-60, 60):  # the page may look a little later
        client.set(cache.requests_key(slug, now - ago), per_second)


def fill_create(page, *, name: str, pool: str, gpus: int, max_replicas: int) -> None:
    form = page.locator("#deployment-create form")
    form.locator("input[name=name]").fill(name)
    form.locator("input[name=model_name]").fill("meta-llama/Llama-3.1-8B-Instruct")
    option = form.locator("select[name=pool] option", has_text=re.compile(rf"^{pool} ·"))
    form.locator("select[name=pool]").select_option(option.get_attribute("value"))
    form.locator("input[name=gpus_per_replica]").fill(str(gpus))
    form.locator("input[name=max_replicas]").fill(str(max_replicas))
    form.get_by_role("button", name="Create deployment").click()


def test_member_deploys_a_model_and_manages_its_keys(
    page, member, tenant, inference_pools, fleet_east
):
    log_in(page, member.username)
    page.get_by_role("link", name="Inference", exact=True).click()
    expect(page).to_have_url(re.compile(r"/tenants/acme/inference/$"))
    expect(page.locator("#deployments-live")).to_contain_text("No deployments yet")

    # A GPU count the fabric cannot give: refused next to the field, nothing created.
    fill_create(page, name="chat", pool="a100-inference", gpus=3, max_replicas=3)
    expect(page.locator("#id_gpus_per_replica-error")).to_contain_text(
        "NVSwitch sets allocate whole partitions of 1, 2, 4 or 8 GPUs"
    )
    expect(page.locator("input[name=name]")).to_have_value("chat")
    assert not InferenceDeployment.objects.exists()
    screenshot(page, "inference-create-refused")

    # The router is already busy by the time the table refreshes (as it would be in use).
    router_counters("acme-chat", queued=3, in_flight={"vm-1": 5}, per_second=12)
    page.locator("input[name=gpus_per_replica]").fill("2")
    page.get_by_role("button", name="Create deployment").click()
    expect(page.locator("#deployment-create [role=status]")).to_contain_text("Created chat")
    row = page.locator("#deployments-live tr.deployment-row", has_text="chat")
    expect(row).to_contain_text("1 pending")
    expect(row).to_contain_text("3 queued · 5 in flight")
    expect(row.locator(".requests-per-second")).to_have_text("12.0")
    expect(row.locator(".router-url")).to_have_text(
        re.compile(r"^http://[^/]+/inference/acme-chat/v1$")
    )
    deployment = InferenceDeployment.objects.get()
    assert (deployment.gpus_per_replica, deployment.max_replicas) == (2, 3)
    screenshot(page, "inference-deployments")

    # The first replica is placed and boots; the live part shows it by its own polling.
    vm = deployment.replicas.get()
    rentals.vm_place(vm=vm, node=fleet_east["nodes"]["a100-001"], gpu_indices=[2, 3])
    rentals.vm_mark_running(vm=vm, ip_address="10.30.0.5", endpoint_url="http://10.30.0.5:8000")
    cache.inference_redis().delete(cache.inflight_key("acme-chat"))
    cache.inference_redis().hset(cache.inflight_key("acme-chat"), vm.instance_id, 5)
    expect(row).to_contain_text("1 running", timeout=8_000)

    row.get_by_role("link", name="chat").click()
    expect(page.locator("h1")).to_contain_text("chat")
    replica = page.locator(f"#replica-{vm.pk}")
    expect(replica.locator(".vm-state")).to_have_text("Running")
    expect(replica).to_contain_text("a100-001")
    expect(replica).to_contain_text("http://10.30.0.5:8000")

    # Widen the range.
    settings = page.locator("#deployment-settings")
    settings.locator("input[name=max_replicas]").fill("4")
    settings.get_by_role("button", name="Save").click()
    expect(settings.locator("[role=status]")).to_contain_text("Saved.")
    expect(page.locator("#deployment-live .deployment-totals")).to_contain_text("of 1..4")
    screenshot(page, "inference-deployment")

    # A key: its secret is shown once, and the snippet carries it.
    keys = page.locator("#api-keys")
    keys.locator("input[name=name]").fill("production chatbot")
    keys.get_by_role("button", name="Create key").click()
    secret = page.locator("#new-key-secret")
    expect(secret).to_be_visible()
    value = secret.inner_text()
    assert SECRET.match(value)
    expect(page.locator("#new-key")).to_contain_text("this is the only time it is shown")
    expect(page.locator("#snippet-curl")).to_contain_text(f'export GPUCAP_API_KEY="{value}"')
    expect(page.locator("#snippet-python")).to_contain_text(
        re.compile(r'OpenAI\(base_url="http://[^"]+/inference/acme-chat/v1"')
    )
    api_key = ApiKey.objects.get()
    assert value.startswith(f"gpk_{api_key.prefix}_")
    screenshot(page, "inference-key-created")

    # Never again: a reload shows the prefix only.
    page.reload()
    expect(page.locator(f"#key-{api_key.pk}")).to_contain_text(f"gpk_{api_key.prefix}_…")
    expect(page.locator("#new-key-secret")).to_have_count(0)
    assert value not in page.content()
    expect(page.locator("#snippet-curl")).to_contain_text('GPUCAP_API_KEY="gpk_…your key…"')

    messages = []
    page.once("dialog", lambda dialog: (messages.append(dialog.message), dialog.accept()))
    page.locator(f"#key-{api_key.pk}").get_by_role("button", name="Revoke").click()
    expect(page.locator("#api-keys [role=status]")).to_contain_text("Revoked production chatbot")
    expect(page.locator(f"#key-{api_key.pk} .key-status")).to_contain_text("Revoked")
    assert messages and messages[0].startswith(
        f"Revoke key production chatbot (gpk_{api_key.prefix}_…)?"
    )
    api_key.refresh_from_db()
    assert api_key.revoked_at is not None
    screenshot(page, "inference-key-revoked")


def test_operator_sees_every_deployment_per_pool(
    page, operator, tenant, other_tenant, inference_pools
):
    fleet.pool_set_tenants(pool=inference_pools["set"], tenants=[tenant, other_tenant])
    for owner, pool, name, model, gpus, low, high in (
        (tenant, "set", "chat", "meta-llama/Llama-3.1-70B-Instruct", 4, 1, 4),
        (other_tenant, "set", "support-bot", "mistralai/Mistral-Large-2", 8, 1, 2),
        (tenant, "standalone", "embed", "BAAI/bge-m3", 1, 2, 8),
    ):
        inference.deployment_create(
            tenant=owner,
            pool=inference_pools[pool],
            name=name,
            model_name=model,
            gpus_per_replica=gpus,
            min_replicas=low,
            max_replicas=high,
        )
    router_counters("acme-chat", queued=12, in_flight={"vm-1": 8}, per_second=31)
    router_counters("globex-support-bot", queued=0, in_flight={"vm-2": 2}, per_second=3)

    log_in(page, operator.username)
    page.get_by_role("link", name="Inference", exact=True).click()
    expect(page).to_have_url(re.compile(r"/deployments/$"))
    pools = page.locator("section.pool-deployments")
    expect(pools).to_have_count(2)
    expect(pools.nth(0).locator(".group-head")).to_contain_text("h100-inference")
    expect(pools.nth(0).locator("tr.deployment-row")).to_have_count(2)
    expect(pools.nth(1).locator(".group-head")).to_contain_text("a100-inference")
    chat = pools.nth(0).locator("tr.deployment-row", has_text="chat")
    expect(chat).to_contain_text("12 queued · 8 in flight")
    expect(page.locator(".totals > div", has_text="Queue depth")).to_contain_text("22")
    screenshot(page, "operator-inference")

    # The live part follows the router's counters by polling.
    router_counters("acme-chat", queued=40, in_flight={"vm-1": 8}, per_second=31)
    expect(chat).to_contain_text("40 queued · 8 in flight", timeout=8_000)
