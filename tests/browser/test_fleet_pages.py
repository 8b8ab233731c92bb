"""The operator and tenant page flows in a real browser: login, the HTMX filter, cordoning a
node through its confirmation dialog, and a tenant kept to their own pages."""

import re

import pytest
from playwright.sync_api import expect

from gpucap.audit.models import AuditEvent
from gpucap.fleet.models import Node
from tests.browser.conftest import log_in, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def test_operator_filters_the_fleet_and_cordons_a_node(page, operator, fleet_east):
    log_in(page, operator.username)
    expect(page.locator("h1")).to_have_text("Needs attention")  # where operators land
    screenshot(page, "operator-attention")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Fleet").click()
    expect(page.locator("h1")).to_have_text("Fleet")
    expect(page.get_by_text("h100-002", exact=True)).to_be_visible()
    screenshot(page, "operator-fleet-overview")

    page.goto("/fleet/nodes/east/h100-001/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cordon").click()
    expect(page.locator("#node-live .state-badge")).to_have_text("Cordoned")
    expect(page.get_by_role("button", name="Uncordon")).to_be_visible()
    assert Node.objects.get(hostname="h100-001").state == "cordoned"
    assert AuditEvent.objects.filter(verb="node.cordon", actor_label=operator.username).exists()

    page.goto("/fleet/")
    page.select_option("select[name=state]", "cordoned")
    expect(page).to_have_url(re.compile(r"state=cordoned"))
    expect(page.get_by_text("h100-001", exact=True)).to_be_visible()
    expect(page.get_by_text("h100-002", exact=True)).to_have_count(0)
    screenshot(page, "operator-fleet-filtered")


def test_a_dismissed_confirmation_changes_nothing(page, operator, fleet_east):
    log_in(page, operator.username)
    page.goto("/fleet/nodes/east/h100-002/")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.get_by_role("button", name="Cordon").click()
    expect(page.locator("#node-live .state-badge")).to_have_text("Ready")
    assert Node.objects.get(hostname="h100-002").state == "ready"


def test_tenant_member_sees_their_tenant_and_not_the_fleet(page, member, fleet_east):
    log_in(page, member.username)
    expect(page.locator("h1")).to_contain_text("Acme AI")
    expect(page.get_by_text("h100-spot")).to_be_visible()
    expect(page.get_by_text("l40s-ondemand")).to_have_count(0)
    screenshot(page, "tenant-landing")
    response = page.goto("/fleet/")
    assert response.status == 403


def test_on_a_phone_the_menu_folds_behind_a_button(browser, live_server, operator, fleet_east):
    context = browser.new_context(base_url=live_server.url, viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        log_in(page, operator.username)
        menu = page.get_by_role("navigation", name="Main")
        expect(menu).to_be_hidden()
        width = page.evaluate("document.documentElement.scrollWidth")
        screenshot(page, "phone-operator-landing")

        page.get_by_role("button", name="Menu").click()
        expect(menu).to_be_visible()
        screenshot(page, "phone-operator-menu")
        menu.get_by_role("link", name="Capacity sets").click()
        expect(page.locator("h1")).to_have_text("Capacity sets")
        assert width <= 390, f"the landing page is {width} px wide on a 390 px phone"
    finally:
        context.close()
