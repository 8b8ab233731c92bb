"""The node page's recovery panel (docs/bmc.md, Recovery): where recovery stands, the cluster's
policy and the node's power cycles; Power-cycle on a down node with a BMC (confirmed, audited,
the cycle sent to a worker) and Clear of a stopped recovery, each answered with the panel alone
to HTMX; a state that forbids it is a 409 with the reason, and nothing changes."""

import pytest
from django.urls import reverse

from gpucap.audit.models import AuditEvent
from gpucap.bmc import recovery
from gpucap.bmc.recovery_models import NodeRecovery, RecoveryAttempt
from gpucap.fleet import services as fleet
from tests.bmc.conftest import TEST_KEY
from tests.bmc.recovery_helpers import give_bmc
from tests.rentals import conftest as rentals_fixtures

sent_tasks = rentals_fixtures.sent_tasks
HTMX = {"HTTP_HX_REQUEST": "true"}


def url(name: str, hostname: str) -> str:
    return reverse(f"fleet:{name}", kwargs={"cluster": "east", "hostname": hostname})


def panel(page: str) -> str:
    start = page.index('id="node-recovery"')
    return " ".join(page[start : page.index("</section>", start)].split())


@pytest.fixture(autouse=True)
def bmc_keys(settings):
    settings.BMC_CREDENTIAL_KEYS = [TEST_KEY]


@pytest.fixture
def down(fleet_east, operator, sent_tasks):
    node = give_bmc(fleet_east["nodes"]["h100-001"], "https://10.0.0.5")
    return fleet.node_set_state(node=node, state="down", actor=operator, message="hung")


def test_a_ready_nodes_page_says_there_is_nothing_to_recover(operator_client, fleet_east):
    shown = panel(operator_client.get(url("node-detail", "h100-002")).content.decode())

    assert "Nothing to recover: the node is ready." in shown
    assert "Power-cycle" not in shown
    assert (
        'Cluster <a href="/fleet/clusters/east/#cluster-recovery">east</a>: no automatic power '
        "cycle · at most 3 failed in a row · boot timeout 900 s" in shown
    )


def test_a_down_node_with_a_bmc_offers_a_confirmed_power_cycle(operator_client, down, fleet_east):
    recovery.recovery_policy_set(
        cluster=fleet_east["cluster"], actor=None, auto_power_cycle=True, grace_seconds=300
    )

    shown = panel(operator_client.get(url("node-detail", "h100-001")).content.decode())

    assert "Down since " in shown
    assert (
        'hx-confirm="Power-cycle h100-001 through its BMC? The machine is forced off and switched '
        'on again; h100-001 is ready once its hypervisor answers (within 900 s)."' in shown
    )
    assert f'hx-post="{url("node-power-cycle", "h100-001")}"' in shown
    assert "automatic power cycle after 300 s down" in shown


def test_a_down_node_without_a_bmc_says_so_and_offers_no_power_cycle(operator_client, fleet_east):
    fleet.node_set_state(node=fleet_east["nodes"]["l40s-001"], state="down")

    shown = panel(operator_client.get(url("node-detail", "l40s-001")).content.decode())

    assert "No BMC address: set them to power-cycle this node." in shown
    assert ">Power-cycle</button>" not in shown


def test_power_cycle_answers_with_the_panel_cycling_and_sends_the_cycle_to_a_worker(
    operator_client, operator, down, sent_tasks, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = operator_client.post(url("node-power-cycle", "h100-001"), **HTMX)

    assert response.status_code == 200
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<section class="panel node-recovery" id="node-recovery"')
    assert "<html" not in fragment
    shown = panel(fragment)
    assert "Power cycle requested" in shown
    assert "Switching the machine off and on through its BMC." in shown
    assert f'hx-get="{url("node-recovery", "h100-001")}" hx-trigger="every 5s"' in shown
    assert f"<td>{operator.username}</td>" in shown and "running" in shown
    [attempt] = RecoveryAttempt.objects.all()
    assert sent_tasks == [("bmc.power_cycle", [attempt.pk])]
    assert AuditEvent.objects.get(verb="bmc.power_cycle").actor == operator

    # Its poll: the panel alone.
    poll = operator_client.get(url("node-recovery", "h100-001"), **HTMX).content.decode()
    assert poll.lstrip().startswith('<section class="panel node-recovery"')


def test_power_cycle_of_a_node_that_is_up_is_refused_with_the_reason(operator_client, fleet_east):
    response = operator_client.post(url("node-power-cycle", "h100-002"), **HTMX)

    assert response.status_code == 409
    assert (
        "Not done: node h100-002 is ready, not down: a power cycle would cut the power under "
        "its VMs" in panel(response.content.decode())
    )
    assert not RecoveryAttempt.objects.exists()
    assert not AuditEvent.objects.filter(verb="bmc.power_cycle").exists()


def test_without_htmx_an_action_goes_back_to_the_node_page_or_shows_it_refused(
    operator_client, down, fleet_east
):
    done = operator_client.post(url("node-power-cycle", "h100-001"))
    assert (done.status_code, done.url) == (302, url("node-detail", "h100-001"))

    refused = operator_client.post(url("node-power-cycle", "h100-001"))
    assert refused.status_code == 409
    page = refused.content.decode()
    assert "<html" in page and "being power-cycled already" in panel(page)
    assert operator_client.get(url("node-recovery", "h100-001")).status_code == 302


def test_a_stopped_recovery_is_shown_and_cleared(operator_client, operator, down):
    NodeRecovery.objects.filter(node=down).update(
        state="stopped", attempts=3, last_error="node h100-001: the BMC refused"
    )

    shown = panel(operator_client.get(url("node-detail", "h100-001")).content.decode())
    assert "Stopped" in shown and "3 power cycles failed" in shown
    assert "node h100-001: the BMC refused" in shown
    assert ">Clear</button>" in shown
    assert ">Power-cycle</button>" in shown  # an operator may still try, whatever the policy

    response = operator_client.post(url("node-recovery-clear", "h100-001"), **HTMX)

    assert response.status_code == 200
    assert "Recovery cleared" in panel(response.content.decode())
    assert NodeRecovery.objects.get(node=down).state == "idle"
    assert AuditEvent.objects.get(verb="bmc.recovery_clear").actor == operator
    again = operator_client.post(url("node-recovery-clear", "h100-001"), **HTMX)
    assert again.status_code == 409


def test_tenant_members_cannot_power_cycle(member_client, down):
    response = member_client.post(url("node-power-cycle", "h100-001"), **HTMX)

    assert response.status_code in (403, 404)
    assert not RecoveryAttempt.objects.exists()
