"""The operators' landing page: what needs attention (plans awaiting approval, open notices
due soonest, failed GPUs, nodes whose recovery stopped, nodes not ready, pending requests by
age, billing push failures), each a count and the most urgent few, linking to where it is
handled."""

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse

from gpucap.bmc import recovery
from gpucap.bmc.recovery_models import NodeRecovery
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Gpu
from gpucap.notices import drains
from gpucap.plans import services as plans
from gpucap.usage import services as usage
from tests.console.test_pages import add_nodes
from tests.rentals.vm_helpers import grant_pools, request_vm, running_vm
from tests.usage.conftest import clock, run_vm  # noqa: F401  (fixtures the billing test uses)
from tests.usage.test_webhook import SECRET, closed_port, records  # noqa: F401

HTMX = {"HX-Request": "true"}
HOME = "/"


@pytest.fixture
def pools(fleet_east, tenant, other_tenant) -> dict:
    return grant_pools(fleet_east, tenant, other_tenant)


def section(page: str, element_id: str) -> str:
    start = page.index(f'id="{element_id}"')
    return page[start : page.index("</section>", start)]


def vm_url(vm) -> str:
    return reverse("rentals:vm-detail", kwargs={"pk": vm.pk})


def node_url(hostname: str, cluster: str = "east") -> str:
    return reverse("fleet:node-detail", kwargs={"cluster": cluster, "hostname": hostname})


def test_an_operator_lands_on_nothing_needs_attention_when_all_is_well(operator_client, fleet_east):
    response = operator_client.get(HOME)

    assert response.status_code == 200
    page = response.content.decode()
    assert "Nothing needs attention" in page
    assert 'id="attention-' not in page
    assert f'href="{reverse("fleet:overview")}"' in page  # the whole fleet is one click away


def test_a_tenant_member_still_lands_on_their_tenant(member_client, tenant):
    response = member_client.get(HOME)
    assert response.status_code == 302
    assert response["Location"] == reverse("tenant-detail", kwargs={"slug": tenant.slug})


def test_a_plan_awaiting_approval_links_to_its_set(operator_client, tenant, pools):
    request_vm(tenant, pools["h100-spot"], name="trainer", gpu_count=8)
    plans.plan_make(capacity_set=pools["h100-spot"].capacity_set)

    page = operator_client.get(HOME).content.decode()

    strip = section(page, "attention-plans")
    assert "Plans awaiting approval" in strip
    assert '<span class="attention-count">1</span>' in strip
    assert f'href="{reverse("fleet:capacity-set-detail", kwargs={"name": "h100-east"})}"' in strip
    assert "1 placement, 0 notices" in strip
    assert "Nothing needs attention" not in page


def test_a_plan_that_changes_nothing_or_runs_under_enforcement_needs_no_approval(
    operator, operator_client, tenant, pools
):
    plans.plan_make(capacity_set=pools["l40s-ondemand"].capacity_set)  # nothing to do
    h100 = pools["h100-spot"].capacity_set
    plans.capacity_set_set_mode(capacity_set=h100, mode="enforce", actor=operator)
    request_vm(tenant, pools["h100-spot"], name="trainer", gpu_count=8)
    plans.plan_make(capacity_set=h100)

    page = operator_client.get(HOME).content.decode()

    assert 'id="attention-plans"' not in page


def test_open_notices_are_listed_due_soonest_first_with_their_deadline(
    operator, operator_client, tenant, pools, fleet_east
):
    nodes = fleet_east["nodes"]
    early = running_vm(
        tenant, pools["h100-spot"], nodes["h100-001"], [0], name="early", ip="10.0.0.1"
    )
    late = running_vm(
        tenant, pools["h100-spot"], nodes["h100-002"], [0], name="late", ip="10.0.0.2"
    )
    drains.node_drain(node=nodes["h100-001"], actor=operator)
    drains.node_drain(node=nodes["h100-002"], actor=operator)
    late.notices.update(deadline=datetime(2099, 1, 1, tzinfo=UTC))

    strip = section(operator_client.get(HOME).content.decode(), "attention-notices")

    assert '<span class="attention-count">2</span>' in strip
    assert strip.index(vm_url(early)) < strip.index(vm_url(late))
    assert 'class="countdown" data-deadline="2099-01-01T00:00:00.000000Z"' in strip
    assert "acme" in strip.lower() and "h100-spot" in strip
    assert f'href="{reverse("notices:list")}"' in strip


def test_failed_gpus_and_nodes_not_ready_link_to_their_node(operator_client, fleet_east):
    nodes = fleet_east["nodes"]
    fleet.gpu_set_health(gpu=Gpu.objects.get(node=nodes["l40s-002"], index=3), health="failed")
    fleet.node_cordon(node=nodes["a100-001"])
    fleet.node_set_state(node=nodes["h100-002"], state="down")

    page = operator_client.get(HOME).content.decode()

    failed = section(page, "attention-failed-gpus")
    assert '<span class="attention-count">1</span>' in failed
    assert f'href="{node_url("l40s-002")}"' in failed and "GPU 3" in failed
    not_ready = section(page, "attention-nodes")
    assert '<span class="attention-count">2</span>' in not_ready
    # Down before cordoned: the worst first.
    assert not_ready.index(node_url("h100-002")) < not_ready.index(node_url("a100-001"))
    assert "Down" in not_ready and "Cordoned" in not_ready


def test_pending_requests_are_listed_oldest_first_with_how_long_they_wait(
    operator_client,
    tenant,
    pools,
    clock,  # noqa: F811
):
    clock.set(datetime(2026, 11, 2, 9, 0, tzinfo=UTC))
    newest = None
    oldest = request_vm(tenant, pools["l40s-ondemand"], name="oldest")
    for minutes in range(1, 7):
        clock.set(datetime(2026, 11, 2, 9, 0, tzinfo=UTC) + timedelta(minutes=10 * minutes))
        newest = request_vm(tenant, pools["l40s-ondemand"], name=f"later-{minutes}")
    clock.set(datetime(2026, 11, 2, 11, 0, tzinfo=UTC))

    strip = section(operator_client.get(HOME).content.decode(), "attention-pending")

    assert '<span class="attention-count">7</span>' in strip
    first = strip[strip.index("<li>") : strip.index("</li>")]
    assert f'href="{vm_url(oldest)}"' in first  # the oldest comes first
    assert "waiting 2\xa0hours" in first
    assert vm_url(newest) not in strip  # five shown...
    assert "and 2 more" in strip  # ...and the rest counted


def test_a_failing_billing_push_links_to_the_billing_settings(
    operator_client,
    records,  # noqa: F811
):
    usage.billing_webhook_configure(
        url=f"http://127.0.0.1:{closed_port()}/usage",
        secret=SECRET,
        enabled=True,
        batch_size=100,
        actor=None,
    )
    usage.billing_push()

    strip = section(operator_client.get(HOME).content.decode(), "attention-billing")

    assert "Billing push failing" in strip
    assert "1 failed push in a row" in strip
    assert f'href="{reverse("usage:billing")}"' in strip


def test_the_strip_refreshes_as_a_fragment(operator_client, fleet_east):
    fleet.node_cordon(node=fleet_east["nodes"]["a100-001"])

    response = operator_client.get(HOME, headers=HTMX)

    html = response.content.decode()
    assert html.lstrip().startswith('<div id="attention"')
    assert "<html" not in html and 'id="attention-nodes"' in html


def test_the_landing_page_runs_a_fixed_number_of_queries_whatever_the_fleet_size(
    operator, operator_client, tenant, pools, fleet_east, django_assert_num_queries
):
    def grow(prefix: str) -> None:
        add_nodes(fleet_east["cluster"], fleet_east["sets"]["l40s-east"], 3, prefix=prefix)
        for number in range(3):
            node = fleet_east["cluster"].nodes.get(hostname=f"{prefix}-{number:03d}")
            running_vm(
                tenant, pools["l40s-ondemand"], node, [1], name=f"{prefix}{number}", ip="10.0.0.3"
            )
            fleet.gpu_set_health(gpu=node.gpus.get(index=0), health="failed")
            drains.node_drain(node=node, actor=operator)
            request_vm(tenant, pools["l40s-ondemand"], name=f"{prefix}-wait-{number}")
            NodeRecovery.objects.create(
                node=node, state="stopped", attempts=3, last_error="no answer from the BMC"
            )
        request_vm(tenant, pools["h100-spot"], name=f"{prefix}-big", gpu_count=8)
        plans.plan_make(capacity_set=fleet_east["sets"]["h100-east"])

    grow("small")
    # session, user, operator group; plans, notices, failed GPUs, recoveries stopped, nodes,
    # pending VMs, billing.
    with django_assert_num_queries(10):
        small = operator_client.get(HOME)
    grow("large")
    grow("larger")
    with django_assert_num_queries(10):
        large = operator_client.get(HOME)

    assert section(small.content.decode(), "attention-nodes").count("<li>") == 3
    nodes = section(large.content.decode(), "attention-nodes")
    assert '<span class="attention-count">9</span>' in nodes
    assert nodes.count("<li>") == 5 and "and 4 more" in nodes


def test_a_member_of_several_tenants_still_picks_one(tenant, other_tenant, member):
    other_tenant.memberships.create(user=member, role="member")
    client = Client()
    client.force_login(member)

    page = client.get(HOME).content.decode()

    assert "Your tenants" in page and "Needs attention" not in page


def test_a_node_whose_recovery_stopped_is_listed_until_an_operator_clears_it(
    operator_client, operator, fleet_east
):
    node = fleet.node_set_state(node=fleet_east["nodes"]["h100-002"], state="down")
    NodeRecovery.objects.filter(node=node).update(
        state="stopped",
        attempts=3,
        last_error="node h100-002: no answer from the BMC at https://10.0.0.5 (connection refused)",
    )

    strip = section(operator_client.get(HOME).content.decode(), "attention-recovery")

    assert '<span class="attention-count">1</span>' in strip
    text = " ".join(strip.split())
    assert (
        f'recovery stopped: <a href="{node_url("h100-002")}">h100-002</a>, '
        '<span class="small">3 power cycles failed:</span> <span class="bad small">node '
        "h100-002: no answer from the BMC at https://10.0.0.5 (connection refused)</span>"
    ) in text

    recovery.recovery_clear(node=node, actor=operator)
    assert 'id="attention-recovery"' not in operator_client.get(HOME).content.decode()
