"""The load simulator in a real browser (issue 21): from the set page the operator opens a new
simulation, makes a mistake that is shown in place, pastes a day of chat load, raises the spot
pool's floor as the edited policy, and starts it; the run's page shows its progress and, once a
worker has carried it out, today's policy and the edited one side by side with the differences
in numbers. Screenshots at desktop and phone width are saved."""

import json

import pytest
from playwright.sync_api import expect

from gpucap.plans.models import SimulationRun
from gpucap.plans.simulation_runs import simulation_carry_out
from tests.browser.conftest import log_in, screenshot
from tests.plans import simulation_set

pytestmark = pytest.mark.django_db(transaction=True)

full_set = simulation_set.full_set
chat = simulation_set.chat
inference_pools = simulation_set.inference_pools
inference_redis = simulation_set.inference_redis

# Chat is quiet at night and needs two replicas from 09:00 to 17:00 (seconds after the start).
DAY = {
    "deployments": {
        "acme-chat": {
            "shape": "step",
            "points": [[0, 0.5], [9 * 3600, 6], [17 * 3600, 0.5]],
            "service_seconds": 1.0,
        }
    }
}


def test_two_policies_side_by_side(page, operator, full_set, chat):
    log_in(page, operator.username)
    page.goto("/fleet/sets/h100-east/")
    section = page.locator("#set-simulations")
    expect(section).to_contain_text("No simulations yet.")
    section.get_by_role("link", name="New simulation").click()

    form = page.locator("#new-simulation")
    form.get_by_label("Name").fill("spot keeps 12 GPUs")
    form.get_by_label("Paste JSON", exact=True).check()
    form.get_by_label("Profile (JSON)").fill('{"deployments": {"acme-chat": ')
    form.get_by_role("button", name="Simulate").click()
    expect(page.locator("#id_profile_text-error")).to_contain_text("is not JSON")
    expect(page.locator(".alert-error").first).to_contain_text("Nothing was stored")
    assert not SimulationRun.objects.exists()
    screenshot(page, "simulation-form-error")

    page.locator("textarea[name=profile_text]").fill(json.dumps(DAY))
    page.locator("input[name='floor__h100-spot']").fill("12")
    page.get_by_role("button", name="Simulate").click()

    expect(page.locator("h1")).to_contain_text("spot keeps 12 GPUs")
    expect(page.locator(".simulation-state")).to_contain_text("Queued")
    simulation_carry_out(run_id=SimulationRun.objects.get().pk)  # as the worker would

    comparison = page.locator(".simulation-comparison")
    expect(comparison).to_be_visible(timeout=30_000)  # the page polls every 2 s
    row = comparison.locator("tr.difference-row", has_text="h100-spot notices/day")
    # One replica through the night, a second at 09:00, and the night's again after 17:00.
    expect(row.locator("td.before")).to_have_text("3")
    expect(row.locator("td.after")).to_have_text("1")
    expect(row).to_contain_text("better")
    screenshot(page, "simulation-comparison")

    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page, "simulation-comparison-phone")
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px on a phone"
