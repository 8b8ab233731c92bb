"""A capacity set's schedule in a real browser (#18): the Schedule section says what a rank is,
the 24-hour timeline shows each boundary with what changes and the spot VMs the arbiter would
notify then (a dry run), an entry is added through the form (a mistake shown in place first),
edited, and deleted through its confirmation; read at desktop and at phone width."""

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from gpucap.plans.models import Plan
from gpucap.schedules import services as schedules
from gpucap.schedules.models import ScheduleEntry
from tests.browser.conftest import SCREENS, log_in, screenshot
from tests.inference import conftest as inference_fixtures
from tests.plans import conftest as plans_fixtures
from tests.schedules import conftest as schedule_fixtures

pytestmark = pytest.mark.django_db(transaction=True)

h100 = plans_fixtures.h100
full_set = plans_fixtures.full_set
chat = schedule_fixtures.chat
inference_redis = inference_fixtures.inference_redis


@pytest.fixture
def scheduled(h100, full_set, chat, operator):
    """An entry opening two hours from now for an hour (UTC, every day) that raises acme-chat's
    minimum to 2 replicas of 4 GPUs, and an override from a capacity controller."""
    opens = (timezone.now() + timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    schedules.schedule_entry_save(
        capacity_set=h100,
        data={
            "name": "evening-burst",
            "days": "every day",
            "start": f"{opens:%H:%M}",
            "end": f"{opens + timedelta(hours=1):%H:%M}",
            "time_zone": "UTC",
            "deployments": {"acme-chat": {"min_replicas": 2}},
        },
        actor=operator,
    )
    schedules.policy_override_set(
        capacity_set=h100,
        data={
            "name": "launch",
            "pools": {"h100-inference": {"floor_gpus": 8}},
            "ttl_seconds": 5 * 3600,
            "reason": "model launch, ticket OPS-1234",
        },
        actor=operator,
    )
    return opens


def test_the_set_page_previews_the_next_24_hours_of_its_schedule(page, operator, h100, scheduled):
    log_in(page, operator.username)
    page.goto("/fleet/sets/h100-east/")
    section = page.locator("#set-schedule")
    expect(section).to_contain_text("rank is a priority, not a calendar")
    expect(section.locator("#override-launch")).to_contain_text("model launch, ticket OPS-1234")
    expect(section.locator(".in-force")).to_contain_text("pool h100-inference floor 8 GPUs")

    boundaries = section.locator("#set-timeline li.boundary")
    expect(boundaries).to_have_count(3)  # the burst opens, closes; the override expires
    opening = boundaries.nth(0)
    expect(opening).to_contain_text(f"{scheduled:%a %H:%M} UTC")
    expect(opening).to_contain_text('Entry "evening-burst" opens')
    expect(opening).to_contain_text("Deployment acme-chat replicas 0-4 → 2-4")
    expect(opening).to_contain_text("Would notify 2 VMs")
    expect(opening.locator("tr.victim-row")).to_have_count(2)
    expect(opening.locator("tr.victim-row").first).to_contain_text("h100-spot")
    expect(boundaries.nth(1)).to_contain_text("Would notify nobody.")
    expect(boundaries.nth(2)).to_contain_text('Override "launch" (set by olivia) expires')
    screenshot(page, "set-schedule-timeline")
    section.screenshot(path=str(SCREENS / "set-schedule-section.png"))
    entries = section.locator("table.schedule-entries")
    entries.screenshot(path=str(SCREENS / "set-schedule-entries.png"))
    assert not Plan.objects.exists(), "the preview stores nothing"

    page.set_viewport_size({"width": 390, "height": 844})
    expect(opening.locator("tr.victim-row")).to_have_count(2)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways on a phone ({width}px)"
    # The entries and overrides stack, each row a card: nothing scrolls sideways inside them.
    for table in ("table.schedule-entries", "table.schedule-overrides"):
        inner, box = overflow(page, table)
        assert inner <= box, f"{table} scrolls sideways on a phone ({inner}px in {box}px)"
    expect(entries.locator("#entry-evening-burst")).to_contain_text("evening-burst")
    expect(entries.get_by_role("button", name="Delete")).to_be_visible()
    screenshot(page, "set-schedule-timeline-phone")
    section.screenshot(path=str(SCREENS / "set-schedule-section-phone.png"))
    entries.screenshot(path=str(SCREENS / "set-schedule-entries-phone.png"))


def overflow(page, selector: str) -> tuple[int, int]:
    """The width of what the table's container holds, and of the container itself."""
    return page.evaluate(
        """(selector) => {
            const box = document.querySelector(selector).parentElement;
            return [box.scrollWidth, box.clientWidth];
        }""",
        selector,
    )


def test_an_entry_is_added_through_the_form_and_deleted_through_its_confirmation(
    page, operator, h100
):
    log_in(page, operator.username)
    page.goto("/fleet/sets/h100-east/")
    section = page.locator("#set-schedule")
    section.locator("summary", has_text="Add or replace an entry").click()
    form = section.locator("form.entry-form")
    form.locator("input[name=name]").fill("night")
    for day in ("Sat", "Sun"):
        form.get_by_label(day, exact=True).check()
    form.locator("input[name=start]").fill("22:00")
    form.locator("input[name=end]").fill("06:00")
    form.locator("input[name=time_zone]").fill("Europe/Berlln")
    form.get_by_label("h100-spot floor GPUs").fill("4")
    form.get_by_role("button", name="Save entry").click()

    error = page.locator("#id_time_zone-error")
    expect(error).to_contain_text("not an IANA time zone")
    section = page.locator("#set-schedule")  # the set page has a reservations form too
    expect(section.locator("input[name=name]")).to_have_value("night")  # as typed
    assert not ScheduleEntry.objects.exists()
    screenshot(page, "set-schedule-form-error")

    section.locator("input[name=time_zone]").fill("Europe/Berlin")
    page.get_by_role("button", name="Save entry").click()
    row = page.locator("#entry-night")
    expect(row).to_contain_text("Sat, Sun 22:00-06:00 Europe/Berlin")
    expect(row).to_contain_text("pool h100-spot floor_gpus 4")
    assert ScheduleEntry.objects.filter(name="night").exists()

    row.get_by_role("link", name="Edit entry night").click()
    expect(page.locator("#entry-form summary")).to_have_text("Edit entry night")
    expect(page.get_by_label("h100-spot floor GPUs")).to_have_value("4")
    expect(page.locator("#set-schedule").get_by_label("Sat", exact=True)).to_be_checked()
    page.get_by_label("h100-spot floor GPUs").fill("8")
    page.get_by_role("button", name="Save entry").click()
    expect(row).to_contain_text("pool h100-spot floor_gpus 8")
    assert ScheduleEntry.objects.count() == 1

    questions = []
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.accept()))
    row.get_by_role("button", name="Delete").click()
    expect(page.locator("#entry-night")).to_have_count(0)
    assert questions and questions[0].startswith("Delete schedule entry night of h100-east?")
    assert not ScheduleEntry.objects.exists()
