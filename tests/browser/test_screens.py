"""The pages people look at first, at a desk (1440x1000) and on a phone (390x844), saved to
artifacts/screens/ as ``screen-<page>-<width>.png`` for a person to look at (issue 15): the
operator's landing page, the fleet, a set page just after Approve (its notices sent), a node
page and the API docs; a tenant's portal with a VM waiting and saying why, and its VM list."""

import re

import pytest
from playwright.sync_api import expect

from gpucap.plans import services as plans
from tests.browser.conftest import log_in, screenshot
from tests.plans import conftest as plans_fixtures
from tests.rentals.vm_helpers import request_vm

pytestmark = pytest.mark.django_db(transaction=True)

h100 = plans_fixtures.h100
full_set = plans_fixtures.full_set
on_demand_request = plans_fixtures.on_demand_request

SIZES = [(1440, 1000), (390, 844)]


@pytest.fixture
def approved(operator, h100, full_set, on_demand_request, fleet_east, tenant):
    """h100-east just after an operator approved reclaiming two spot VMs for globex, and one of
    acme's spot requests waiting behind it."""
    on_demand_request()
    plan = plans.capacity_set_tick(capacity_set_id=h100.pk).plan
    plans.plan_approve(plan=plan, actor=operator)
    waiting = request_vm(tenant, fleet_east["pools"]["h100-spot"], name="eval-later", gpu_count=4)
    return {"plan": plan, "waiting": waiting}


@pytest.mark.parametrize(("width", "height"), SIZES, ids=["desk", "phone"])
def test_the_first_pages_at_a_desk_and_on_a_phone(
    browser, live_server, operator, member, tenant, approved, width, height
):
    context = browser.new_context(
        base_url=live_server.url, viewport={"width": width, "height": height}
    )
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        log_in(page, operator.username)
        expect(page.locator("h1")).to_have_text("Needs attention")
        screenshot(page, f"screen-landing-{width}")

        page.goto("/fleet/")
        expect(page.locator("h1")).to_have_text("Fleet")
        screenshot(page, f"screen-fleet-{width}")

        page.goto("/fleet/sets/h100-east/")
        expect(page.locator(f"#plan-{approved['plan'].pk} .plan-status")).to_have_text("Applied")
        expect(page.locator("#plan-progress")).to_contain_text("2 of 2 notices sent")
        expect(page.locator(".countdown").first).to_have_text(re.compile(r"\d:\d\d left$"))
        # The pools' figures sit inside their card, and the page is no wider than the screen.
        card = page.locator("#pool-bars").bounding_box()
        for figures in page.locator("#pool-bars .bar-figures").all():
            box = figures.bounding_box()
            assert card["x"] <= box["x"] and box["x"] + box["width"] <= card["x"] + card["width"]
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        screenshot(page, f"screen-set-approved-{width}")

        page.goto("/vms/")
        expect(page.locator("h1")).to_have_text("VMs")
        # The table of every tenant's VMs scrolls inside itself; the page stays the screen's width.
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        screenshot(page, f"screen-vms-{width}")

        page.goto("/fleet/nodes/east/h100-001/")
        expect(page.locator("h1")).to_have_text("h100-001")
        screenshot(page, f"screen-node-{width}")

        page.goto("/api/docs/")
        # Swagger UI renders the whole schema first: seconds on a loaded machine.
        expect(page.locator(".swagger-ui .title").first).to_contain_text(
            "gpucap API", timeout=60_000
        )
        screenshot(page, f"screen-api-docs-{width}")

        context.clear_cookies()
        log_in(page, member.username)
        row = page.locator("tr", has_text="eval-later")
        expect(row).to_contain_text("Pending")
        expect(row).to_contain_text("in line")
        screenshot(page, f"screen-tenant-portal-{width}")

        page.goto(f"/tenants/{tenant.slug}/vms/")
        expect(page.locator("h1")).to_have_text("VMs")
        # Beside the Request VM form the table scrolls inside its card; it never spills out of it.
        panel = page.locator("#vm-table")
        assert panel.evaluate("card => card.scrollWidth <= card.clientWidth")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        screenshot(page, f"screen-tenant-vms-{width}")
    finally:
        context.close()
