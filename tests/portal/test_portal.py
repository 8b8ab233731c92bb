"""The tenant portal (a tenant's home): its VMs with open notices counting down, inference
deployments, API keys and this month's GPU-hours; the operators' list of tenants; operators
looking in read-only."""

from datetime import UTC, datetime

import pytest
from django.test import Client
from django.urls import reverse

from gpucap.fleet import services as fleet
from gpucap.inference import services as inference
from gpucap.notices import dedications, drains
from gpucap.rentals import services as rentals
from gpucap.tenancy.models import Membership, Tenant
from tests.rentals.vm_helpers import grant_pools, request_vm, running_vm
from tests.usage import conftest as usage_fixtures

HTMX = {"HX-Request": "true"}
clock = usage_fixtures.clock


def portal_url(slug: str = "acme") -> str:
    return reverse("tenant-detail", kwargs={"slug": slug})


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def section(page: str, element_id: str) -> str:
    start = page.index(f'id="{element_id}"')
    return page[start : page.index("</section>", start)]


@pytest.fixture
def pools(fleet_east, tenant, other_tenant):
    pools = grant_pools(fleet_east, tenant, other_tenant)
    fleet.pool_set_tenants(pool=pools["h100-inference"], tenants=[tenant])
    return pools


def deploy(tenant, pools, name: str, **settings):
    return inference.deployment_create(
        tenant=tenant,
        pool=pools["h100-inference"],
        name=name,
        model_name="gpucap/sim-8b",
        gpus_per_replica=1,
        **settings,
    )


# --- what a member sees ----------------------------------------------------------------------


def test_member_sees_their_vms_with_state_gpus_node_and_a_notice_counting_down(
    member, operator, tenant, pools, fleet_east
):
    nodes = fleet_east["nodes"]
    spot = running_vm(
        tenant, pools["h100-spot"], nodes["h100-001"], [4, 5], name="spot-a", ip="10.0.0.5"
    )
    notice = drains.vm_reclaim(vm=spot, actor=operator)
    request_vm(tenant, pools["a100-standalone"], name="waits", gpu_count=8)
    gone = request_vm(tenant, pools["a100-standalone"], name="gone", gpu_count=1)
    rentals.vm_terminate(vm=gone)

    page = logged_in(member).get(portal_url()).content.decode()
    vms = section(page, "portal-vms")
    row = vms[vms.index(f'id="vm-{spot.pk}"') :]
    row = row[: row.index("</tr>")]
    assert ">Notified<" in row
    assert "reclaim notice" in row
    deadline = notice.deadline.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    assert f'class="countdown" data-deadline="{deadline}' in row
    assert "2 \u00d7 H100-SXM5-80GB" in row and "h100-001 · GPUs" in row and ">4,5<" in row
    assert "waits" in vms and "waiting for capacity" in vms
    assert "gone" not in vms  # terminated VMs leave the portal
    # The VM with an open notice comes first, whatever its age.
    assert vms.index("spot-a") < vms.index("waits")


def test_portal_shows_deployments_with_replicas_ready_and_their_endpoint(member, tenant, pools):
    chat = deploy(tenant, pools, "chat", min_replicas=2, max_replicas=3)
    page = logged_in(member).get(portal_url()).content.decode()
    deployments = section(page, "portal-deployments")
    assert ">chat</a>" in deployments and "gpucap/sim-8b" in deployments
    assert '<span class="replicas-ready"><strong>0</strong> of 2</span>' in deployments
    assert "(range 2..3)" in deployments
    assert f"<code>http://testserver/inference/{chat.slug}/v1</code>" in deployments
    # Replicas belong to their deployment, not to the VM list.
    assert "No VMs running or waiting." in section(page, "portal-vms")


def test_portal_lists_api_keys_with_prefix_scope_expiry_last_use_and_revocation(
    member, tenant, pools
):
    chat = deploy(tenant, pools, "chat")
    one, _ = inference.api_key_create(tenant=tenant, name="chatbot", deployment=chat)
    every, _ = inference.api_key_create(
        tenant=tenant, name="batch", expires_at=datetime(2030, 1, 2, 3, 4, tzinfo=UTC)
    )
    inference.api_key_revoke(api_key=one)
    page = logged_in(member).get(portal_url()).content.decode()
    keys = section(page, "portal-keys")
    chatbot = keys[keys.index(f'id="key-{one.pk}"') :]
    chatbot = chatbot[: chatbot.index("</tr>")]
    assert f"gpk_{one.prefix}_…" in chatbot and ">chat</a>" in chatbot and "Revoked" in chatbot
    batch = keys[keys.index(f'id="key-{every.pk}"') :]
    batch = batch[: batch.index("</tr>")]
    assert "all deployments" in batch and "2030-01-02 03:04" in batch and "Active" in batch
    assert batch.count("never") == 1  # never used; it does expire
    assert '"Last used" is brought up to date every 60 s' in keys  # why "never" may be stale


def test_gpu_hours_this_month_count_only_this_month_and_this_tenant(
    clock, member, tenant, other_tenant, pools, fleet_east
):
    nodes = fleet_east["nodes"]
    # October's last hour and November's first: only the second counts.
    clock.set(datetime(2026, 10, 31, 23, 0, tzinfo=UTC))
    late = running_vm(
        tenant, pools["a100-standalone"], nodes["a100-001"], [0], name="late", ip="10.0.0.2"
    )
    clock.set(datetime(2026, 11, 1, 1, 0, tzinfo=UTC))
    rentals.vm_stop(vm=late)
    rentals.vm_mark_stopped(vm=late)
    # Two spot GPUs for three hours, still running; globex's GPUs are not acme's.
    clock.set(datetime(2026, 11, 2, 8, 0, tzinfo=UTC))
    running_vm(tenant, pools["h100-spot"], nodes["h100-002"], [0, 2], name="train", ip="10.0.0.3")
    running_vm(
        other_tenant, pools["l40s-ondemand"], nodes["l40s-001"], [0], name="g", ip="10.0.0.4"
    )
    clock.set(datetime(2026, 11, 2, 11, 0, tzinfo=UTC))

    response = logged_in(member).get(portal_url())
    usage = {total.kind: total.gpu_hours for total in response.context["live"].usage}
    assert usage == {"on_demand": 1, "spot": 6, "inference": 0}
    panel = section(response.content.decode(), "portal-usage")
    assert "November 2026 (UTC)" in panel
    assert '<div class="usage-spot"><dt>Spot</dt><dd>6.0</dd></div>' in panel
    assert '<div class="usage-total"><dt>Total</dt><dd>7.0</dd></div>' in panel
    assert 'href="/tenants/acme/usage/"' in panel


def test_portal_links_to_the_full_pages(member, tenant):
    page = logged_in(member).get(portal_url()).content.decode()
    for url in (
        reverse("rentals:tenant-vms", kwargs={"slug": "acme"}),
        reverse("inference:tenant-deployments", kwargs={"slug": "acme"}),
        reverse("notices:list"),
        "/tenants/acme/usage/",
        reverse("tenant-members", kwargs={"slug": "acme"}),
    ):
        assert f'href="{url}"' in page, url


def test_the_live_part_polls_a_fragment_of_vms_deployments_and_usage_only(
    member, tenant, pools, fleet_east
):
    request_vm(tenant, pools["a100-standalone"], name="waits", gpu_count=8)
    response = logged_in(member).get(portal_url(), headers=HTMX)
    page = response.content.decode()
    assert page.lstrip().startswith(f'<div id="portal-live" hx-get="{portal_url()}"')
    assert "<html" not in page and "portal-keys" not in page and "tenant-pools" not in page
    assert "waits" in page
    assert 'hx-trigger="every 3s"' in page  # a pending VM is about to change: poll fast
    assert response["Vary"] == "Cookie, HX-Request" or "HX-Request" in response["Vary"]


def test_another_tenants_portal_is_404(other_member, tenant, pools):
    assert logged_in(other_member).get(portal_url("acme")).status_code == 404
    assert logged_in(other_member).get(portal_url("acme"), headers=HTMX).status_code == 404


def _fill(tenant, pools, fleet_east, operator, n: int, offset: int) -> None:
    """n more of everything the portal shows: VMs (one with a notice), deployments, keys."""
    for i in range(n):
        vm = running_vm(
            tenant,
            pools["h100-spot"],
            fleet_east["nodes"]["h100-001"],
            [offset + i],
            name=f"vm-{offset + i}",
            ip=f"10.1.0.{offset + i}",
        )
        drains.vm_reclaim(vm=vm, actor=operator)
        chat = deploy(tenant, pools, f"chat-{offset + i}")
        inference.api_key_create(tenant=tenant, name=f"key-{offset + i}", deployment=chat)


def test_portal_runs_a_fixed_number_of_queries(
    member, operator, tenant, pools, fleet_east, django_assert_num_queries
):
    client = logged_in(member)
    _fill(tenant, pools, fleet_east, operator, 1, 0)
    dedications.node_dedicate(node=fleet_east["nodes"]["h100-001"], tenant=tenant, actor=operator)
    # session, user, member's tenant ids; tenant; role; keys; VMs, their GPUs; usage;
    # deployments; pools, usable GPUs; member count; dedicated nodes, their VMs; quotas;
    # reservations.
    with django_assert_num_queries(17):
        client.get(portal_url())
    _fill(tenant, pools, fleet_east, operator, 4, 1)
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[tenant])
    dedications.node_dedicate(node=fleet_east["nodes"]["h100-002"], tenant=tenant, actor=operator)
    with django_assert_num_queries(17):
        response = client.get(portal_url())
    assert [d.node.hostname for d in response.context["portal"].dedicated] == [
        "h100-001",
        "h100-002",
    ]
    assert len(response.context["portal"].dedicated[0].vms) == 5
    assert len(response.context["live"].vms) == 5
    assert len(response.context["live"].deployments.rows) == 5
    assert len(response.context["portal"].keys) == 5
    # The poll reads the live part only: session, user, tenant ids, tenant, VMs, GPUs, usage,
    # deployments.
    with django_assert_num_queries(8):
        client.get(portal_url(), headers=HTMX)


# --- operators ---------------------------------------------------------------------------------


def test_operator_sees_any_portal_read_only_without_forms(operator, tenant, pools, fleet_east):
    running_vm(
        tenant, pools["h100-spot"], fleet_east["nodes"]["h100-001"], [0], name="x", ip="10.0.0.9"
    )
    response = logged_in(operator).get(portal_url())
    page = response.content.decode()
    assert response.status_code == 200
    assert "Viewing Acme AI as operator (read-only)." in page
    assert "Your role:" not in page
    assert page.count("<form") == 1  # sign out only
    assert f'href="{reverse("tenant-list")}"' in page
    assert ">x</a>" in page


def test_operator_lists_tenants_with_vm_and_gpu_counts_linking_to_each_portal(
    operator, tenant, other_tenant, member, other_member, pools, fleet_east
):
    nodes = fleet_east["nodes"]
    running_vm(tenant, pools["h100-spot"], nodes["h100-001"], [0, 1], name="a", ip="10.0.0.1")
    request_vm(tenant, pools["a100-standalone"], name="b", gpu_count=8)
    running_vm(
        other_tenant, pools["l40s-ondemand"], nodes["l40s-001"], [3], name="c", ip="10.0.0.2"
    )
    deploy(tenant, pools, "chat")
    response = logged_in(operator).get(reverse("tenant-list"))
    page = response.content.decode()
    assert response.status_code == 200
    counts = {
        t.slug: (t.vm_count, t.gpu_count, t.deployment_count, t.notice_count, t.member_count)
        for t in response.context["tenants"]
    }
    assert counts == {"acme": (2, 2, 1, 0, 1), "globex": (1, 1, 0, 0, 1)}
    assert f'href="{portal_url("acme")}"' in page and f'href="{portal_url("globex")}"' in page
    assert f'<a href="{reverse("tenant-list")}" aria-current="page">Tenants</a>' in page


def test_tenant_list_is_for_operators_only(member):
    assert logged_in(member).get(reverse("tenant-list")).status_code == 403
    assert ">Tenants</a>" not in logged_in(member).get(portal_url()).content.decode()


def test_tenant_list_runs_one_query_for_any_number_of_tenants(
    operator, pools, fleet_east, django_assert_num_queries
):
    client = logged_in(operator)
    # session, user, operator group; tenants.
    with django_assert_num_queries(4):
        client.get(reverse("tenant-list"))
    for n in range(5):
        extra = Tenant.objects.create(name=f"Extra {n}", slug=f"extra-{n}")
        Membership.objects.create(user=operator, tenant=extra)
        fleet.pool_set_tenants(pool=pools["h100-spot"], tenants=[extra])
        request_vm(extra, pools["h100-spot"], name=f"v{n}", gpu_count=1)
    with django_assert_num_queries(4):
        response = client.get(reverse("tenant-list"))
    assert len(response.context["tenants"]) == 7
