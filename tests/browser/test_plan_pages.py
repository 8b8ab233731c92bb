"""The arbiter's operator flow in a real browser (DESIGN.md section 8): open a full capacity set
with a waiting on-demand request, read the dry-run preview naming the spot victims, Approve it
through its confirmation dialog and see the notices sent, then Enable enforcement and see the
set enforcing. No Celery worker runs here: the test makes the plan with the set's tick, as the
worker would."""

import re

import pytest
from playwright.sync_api import expect

from gpucap.audit.models import AuditEvent
from gpucap.fleet.models import CapacitySet
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services
from gpucap.plans.models import Plan
from tests.browser.conftest import log_in, screenshot
from tests.plans import conftest as plans_fixtures

pytestmark = pytest.mark.django_db(transaction=True)

# The plans tests' fixtures: h100-east full of acme's spot VMs, and globex's on-demand request.
h100 = plans_fixtures.h100
full_set = plans_fixtures.full_set
on_demand_request = plans_fixtures.on_demand_request


def test_operator_previews_approves_and_enables_enforcement(
    page, operator, h100, full_set, on_demand_request
):
    train = on_demand_request()
    plan = services.capacity_set_tick(capacity_set_id=h100.pk).plan
    victims = sorted(full_set[2:], key=lambda vm: vm.pk)  # the two most recently started

    log_in(page, operator.username)
    page.goto("/fleet/sets/h100-east/")
    preview = page.locator(f"#plan-{plan.pk}")
    expect(preview.locator(".plan-status")).to_have_text("Proposed")
    rows = preview.locator("tr.preemption-row")
    expect(rows).to_have_count(2)
    for row, victim in zip(rows.all(), victims, strict=True):
        expect(row).to_contain_text(victim.name)
        expect(row).to_contain_text("Acme AI")
        expect(row).to_contain_text("h100-spot")
        expect(row).to_contain_text("h100-002")
        expect(row).to_contain_text("reclaimed for")
    expect(preview.locator("tr.placement-row")).to_contain_text(train.name)
    # Plan tables take the page's width: no column is clipped by the what-if form beside them.
    table = preview.locator("table.preemptions")
    assert table.evaluate("t => t.parentElement.scrollWidth <= t.parentElement.clientWidth")
    expect(page.locator("#bar-h100-spot .bar-figures")).to_contain_text("16")
    screenshot(page, "plan-preview")
    assert not InterruptionNotice.objects.exists(), "a preview changes nothing"

    questions = []
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.accept()))
    page.get_by_role("button", name=f"Approve plan {plan.pk}").click()
    expect(preview.locator(".plan-status")).to_have_text("Applied")
    expect(page.locator("#plan-progress")).to_contain_text("2 of 2 notices sent")
    expect(preview.locator("tr.preemption-row .progress").first).to_have_text("notice sent")
    assert questions == [
        f"Approve plan {plan.pk}? 2 VMs get 120 s notices (8 GPUs); 1 demand is placed"
    ]
    assert sorted(InterruptionNotice.objects.values_list("vm__name", flat=True)) == [
        victim.name for victim in victims
    ]
    # The whole page follows the Approve, not only the plan: the header's generation and the
    # node grid, where the victims' GPUs are now leaving; each notice counts down.
    generation = CapacitySet.objects.get(pk=h100.pk).generation
    expect(page.locator("#set-head .set-generation")).to_have_text(str(generation))
    expect(page.locator("#set-nodes .tiles .gpu-leaving")).to_have_count(8)
    countdowns = preview.locator("tr.preemption-row .countdown")
    expect(countdowns).to_have_count(2)
    expect(countdowns.first).to_have_text(re.compile(r"^[12]:\d\d left$"))
    # Relative times keep ticking between polls.
    made = preview.locator(".plan-facts time").first
    shown = made.inner_text()
    expect(made).not_to_have_text(shown, timeout=15_000)
    screenshot(page, "plan-approved")

    # What if on-demand asked for 8 more GPUs? spot-1 and spot-2 would go; nothing is stored.
    plans = Plan.objects.count()
    what_if = page.locator("#what-if")
    what_if.get_by_label("Pool").select_option(label="2. h100-ondemand (On-demand)")
    what_if.get_by_label("GPUs").fill("8")
    what_if.get_by_label("In blocks of").select_option("8")
    what_if.get_by_role("button", name="Preview").click()
    expect(what_if.locator(".alert-ok")).to_contain_text("reclaiming 8 GPUs from 2 VMs")
    expect(what_if.locator("tr.reclaimed-row")).to_have_count(2)
    expect(what_if.locator("tr.reclaimed-row", has_text="spot-1")).to_contain_text("h100-001")
    expect(what_if.locator("tr.reclaimed-row", has_text="spot-2")).to_contain_text("h100-001")
    screenshot(page, "plan-what-if")
    assert Plan.objects.count() == plans

    # A what-if the fabric cannot give is refused next to the field.
    what_if.get_by_label("GPUs").fill("6")
    what_if.get_by_role("button", name="Preview").click()
    expect(page.locator("#id_gpus-error")).to_contain_text("not a whole number of 8-GPU blocks")

    # A newer plan does not push the applied one off the page while its notices run.
    on_demand_request(name="train-2")
    fresh = services.capacity_set_tick(capacity_set_id=h100.pk).plan
    assert fresh.pk != plan.pk and fresh.status == Plan.Status.PROPOSED
    expect(page.locator(f"#plan-{fresh.pk} h2")).to_contain_text("Latest plan", timeout=15_000)
    expect(preview.locator("h2")).to_contain_text(f"In flight: plan {plan.pk}")
    expect(preview.locator("tr.preemption-row .countdown")).to_have_count(2)
    screenshot(page, "plan-in-flight")

    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.accept()))
    page.get_by_role("button", name="Enable enforcement").click()
    expect(page.locator("#set-mode .badge")).to_have_text("Enforcing")
    expect(page.locator("#plan-live .arbiter-mode .badge")).to_have_text("Enforcing")
    expect(page.get_by_role("button", name="Switch to dry-run")).to_be_visible()
    assert re.match(r"Enable enforcement on h100-east\? From now on every plan", questions[-1])
    assert CapacitySet.objects.get(pk=h100.pk).mode == CapacitySet.Mode.ENFORCE
    assert AuditEvent.objects.filter(verb="capacity_set.mode", actor=operator).exists()
    assert Plan.objects.get(pk=plan.pk).approved_by == operator
    screenshot(page, "plan-enforcing")
