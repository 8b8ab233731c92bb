"""Pages work under the Content-Security-Policy (gpucap/settings.py): the set page, a VM page, the
tenant portal and the API docs (Swagger UI and Redoc) load, their scripts run, and the browser
reports no violation of the policy, neither as a ``securitypolicyviolation`` event nor in the
console."""

import re

import pytest
from playwright.sync_api import expect

from gpucap.plans import services as plans
from tests.browser.conftest import log_in
from tests.plans import conftest as plans_fixtures
from tests.rentals.vm_helpers import request_vm

pytestmark = pytest.mark.django_db(transaction=True)

h100 = plans_fixtures.h100
full_set = plans_fixtures.full_set
on_demand_request = plans_fixtures.on_demand_request


@pytest.fixture
def approved(operator, h100, full_set, on_demand_request, fleet_east, tenant):
    """h100-east just after an operator approved a plan (notices counting down), and one of
    acme's spot requests waiting."""
    on_demand_request()
    plan = plans.capacity_set_tick(capacity_set_id=h100.pk).plan
    plans.plan_approve(plan=plan, actor=operator)
    waiting = request_vm(tenant, fleet_east["pools"]["h100-spot"], name="eval-later", gpu_count=4)
    return {"plan": plan, "waiting": waiting}


@pytest.fixture
def violations(page):
    """Every CSP violation the browser reports on ``page``, as text, across navigations."""
    reported: list[str] = []
    page.expose_function("reportCspViolation", lambda text: reported.append(text))
    page.add_init_script(
        "document.addEventListener('securitypolicyviolation', (event) => "
        "window.reportCspViolation(`${event.violatedDirective} blocked ${event.blockedURI} "
        "at ${event.sourceFile}:${event.lineNumber}`));"
    )
    page.on(
        "console",
        lambda message: (
            reported.append(message.text)
            if "Content Security Policy" in message.text
            or "Content-Security-Policy" in message.text
            else None
        ),
    )
    return reported


def test_the_pages_work_under_the_content_security_policy_without_a_violation(
    page, violations, operator, member, approved
):
    log_in(page, operator.username)

    response = page.goto("/fleet/sets/h100-east/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    expect(page.locator(f"#plan-{approved['plan'].pk} .plan-status")).to_have_text("Applied")
    # countdown.js runs: the notices count down.
    expect(page.locator(".countdown").first).to_have_text(re.compile(r"\d:\d\d left$"))

    # htmx runs (a filter swaps the table and pushes its URL) and gpucap.js leaves empty filters
    # out of that URL.
    page.goto("/vms/")
    page.select_option("select[name=state]", "pending")
    expect(page).to_have_url(re.compile(r"/vms/\?state=pending$"))
    expect(page.locator("#vm-table")).to_contain_text("eval-later")
    page.get_by_role("link", name="eval-later").click()
    expect(page.locator("h1")).to_contain_text("eval-later")

    # The menu button of a narrow screen opens the menu (its handler is in gpucap.js).
    page.set_viewport_size({"width": 390, "height": 844})
    toggle = page.locator(".menu-toggle")
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expect(page.locator("#main-nav")).to_be_visible()
    page.set_viewport_size({"width": 1400, "height": 900})

    # The usage period: a month clears the days (gpucap.js), and the report follows.
    page.goto("/usage/")
    page.fill("input[name=since]", "2026-10-01")
    page.fill("input[name=month]", "2026-11")
    expect(page.locator("input[name=since]")).to_have_value("")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#usage-report h2").first).to_contain_text("November 2026")

    page.goto("/api/docs/")
    # Swagger UI's start-up script is a file of its own (?script); the schema takes a while.
    expect(page.locator(".swagger-ui .title").first).to_contain_text("gpucap API", timeout=60_000)
    page.locator(".opblock-summary", has_text="/api/nodes/").first.click()
    expect(page.locator(".opblock-body").first).to_be_visible()

    page.context.clear_cookies()
    log_in(page, member.username)
    row = page.locator("tr", has_text="eval-later")
    expect(row).to_contain_text("Pending")
    page.wait_for_load_state("networkidle")

    assert violations == [], "\n".join(violations)


def test_redoc_works_under_its_relaxed_policy_with_only_its_cdn_logo_blocked(
    page, violations, operator
):
    log_in(page, operator.username)

    page.goto("/api/redoc/")
    expect(page.locator("h1").first).to_contain_text("gpucap API", timeout=60_000)
    # Its search runs in a worker made from a blob.
    page.get_by_placeholder("Search...").fill("nodes")
    results = page.locator("[data-role='search:results'] [role=menuitem]")
    expect(results.first).to_be_visible(timeout=30_000)

    assert violations and all("cdn.redoc.ly" in text for text in violations), violations
