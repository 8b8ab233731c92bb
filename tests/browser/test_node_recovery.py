"""The node page's recovery panel in a real browser: an operator power-cycles a down node
through its confirmation dialog (dismissed, nothing happens; accepted, the cycle starts and the
panel says so, its history showing who asked), on a desktop and on a phone. No worker runs here:
the cycle's task is recorded, not carried out (tests/bmc/ runs cycles for real)."""

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from gpucap.audit.models import AuditEvent
from gpucap.bmc.recovery_models import NodeRecovery, RecoveryAttempt
from gpucap.celery import app
from gpucap.fleet import services as fleet
from tests.bmc.conftest import TEST_KEY
from tests.bmc.recovery_helpers import give_bmc
from tests.browser.conftest import log_in, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def down_node(fleet_east, operator, settings, monkeypatch):
    """h100-001 down for ten minutes, one automatic power cycle failed already; what tasks are
    sent."""
    settings.BMC_CREDENTIAL_KEYS = [TEST_KEY]
    sent = []
    monkeypatch.setattr(app, "send_task", lambda name, args=None, **kw: sent.append((name, args)))
    node = give_bmc(fleet_east["nodes"]["h100-001"], "https://10.0.0.5")
    node = fleet.node_set_state(node=node, state="down", actor=None, message="hung")
    earlier = timezone.now() - timedelta(minutes=10)
    error = "node h100-001: no answer from the BMC at https://10.0.0.5 (connection refused)"
    NodeRecovery.objects.filter(node=node).update(down_since=earlier, attempts=1, last_error=error)
    RecoveryAttempt.objects.create(
        node=node,
        trigger="automatic",
        started_at=earlier + timedelta(minutes=1),
        claimed_at=earlier + timedelta(minutes=1),
        finished_at=earlier + timedelta(minutes=1, seconds=5),
        outcome="failed",
        message=error,
    )
    return sent


def test_an_operator_power_cycles_a_down_node_after_confirming(page, operator, down_node):
    sent = down_node
    log_in(page, operator.username)
    page.goto("/fleet/nodes/east/h100-001/")
    panel = page.locator("#node-recovery")
    expect(panel.get_by_text("Down since")).to_be_visible()
    expect(panel.locator(".recovery-attempt")).to_have_count(1)

    page.once("dialog", lambda dialog: dialog.dismiss())
    panel.get_by_role("button", name="Power-cycle").click()
    expect(panel.get_by_role("button", name="Power-cycle")).to_be_visible()
    assert not RecoveryAttempt.objects.filter(finished_at=None).exists()

    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    panel.get_by_role("button", name="Power-cycle").click()

    expect(panel.get_by_text("Power cycle requested")).to_be_visible()
    expect(panel.locator(".recovery-state .badge")).to_have_text("Power cycling")
    expect(panel.get_by_role("button", name="Power-cycle")).to_have_count(0)
    expect(panel.locator(".recovery-attempt").first).to_contain_text(operator.username)
    assert asked[0].startswith("Power-cycle h100-001 through its BMC?")
    attempt = RecoveryAttempt.objects.get(finished_at=None)
    assert sent == [("bmc.power_cycle", [attempt.pk])]
    assert AuditEvent.objects.filter(verb="bmc.power_cycle", actor_label=operator.username).exists()
    panel.scroll_into_view_if_needed()
    screenshot(page, "node-recovery")

    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    panel = page.locator("#node-recovery")
    expect(panel.locator(".recovery-attempt")).to_have_count(2)
    panel.scroll_into_view_if_needed()
    screenshot(page, "phone-node-recovery")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the node page is {width} px wide on a 390 px phone"
