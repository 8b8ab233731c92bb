"""The node page's provisioning panel in a real browser: an operator types an image URL that is
no web address and is told so next to the field, then a good one, confirms, and watches the
run's steps advance as the panel polls; on a phone the panel fits the screen."""

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from gpucap.bmc.models import Provisioning
from gpucap.bmc.services import bmc_credential_set
from gpucap.fleet import services as fleet
from tests.browser.conftest import log_in, screenshot
from tests.rentals import conftest as rentals_fixtures

pytestmark = pytest.mark.django_db(transaction=True)

celery_queue = rentals_fixtures.celery_queue  # the step the run sends goes to a queue of ours
KEY = "dGVzdHMtb25seS1ibWMta2V5LTMyLWJ5dGVzLWxvbmc="
IMAGE = "https://images.example/ubuntu-24.04-live-server-amd64.iso"
POLL = 15_000  # ms: the panel polls every 5 s


@pytest.fixture
def node(fleet_east, operator, settings, celery_queue):
    """a100-001, cordoned, with BMC credentials and one earlier run that timed out."""
    settings.BMC_CREDENTIAL_KEYS = [KEY]
    node = fleet_east["nodes"]["a100-001"]
    node.bmc_address = "https://10.0.0.5"
    node.save(update_fields=["bmc_address"])
    bmc_credential_set(node=node, username="admin", password="bmc-password")
    started = timezone.now() - timedelta(days=1)
    Provisioning.objects.create(
        node=node,
        image_url="https://images.example/debian-12-netinst.iso",
        state=Provisioning.State.FAILED,
        started_at=started,
        deadline=started + timedelta(hours=1),
        inserted_at=started + timedelta(seconds=4),
        reset_at=started + timedelta(seconds=7),
        reset_type="ForceRestart",
        finished_at=started + timedelta(hours=1),
        message="the BMC accepted the image and the machine was reset at 10:02 UTC, but its "
        "hypervisor has not answered by 11:02 UTC; power is On; the image was still inserted "
        "and is ejected now",
    )
    return fleet.node_cordon(node=node, actor=operator)


def test_an_operator_boots_a_node_from_an_image_and_watches_it(page, operator, node):
    log_in(page, operator.username)
    page.goto("/fleet/nodes/east/a100-001/")
    panel = page.locator("#node-provisioning")
    expect(panel.get_by_role("alert")).to_contain_text("Failed: the BMC accepted the image")

    panel.get_by_label("Image URL").fill("installer.iso")
    page.once("dialog", lambda dialog: dialog.accept())
    panel.get_by_role("button", name="Boot from image").click()
    expect(panel.locator(".field-error")).to_have_text(
        "Image URL: must be an http:// or https:// URL the BMC can fetch the image from"
    )
    assert Provisioning.objects.count() == 1

    panel.get_by_label("Image URL").fill(IMAGE)
    page.once("dialog", lambda dialog: dialog.accept())
    panel.get_by_role("button", name="Boot from image").click()
    expect(panel.locator(".step-current")).to_contain_text("Inserting the image")
    expect(panel.get_by_role("button", name="Boot from image")).to_have_count(0)
    run = Provisioning.objects.get(state=Provisioning.State.INSERTING)
    assert run.requested_by == operator

    # What the task does next, as the BMC answers: the image taken, the machine reset.
    now = timezone.now()
    Provisioning.objects.filter(pk=run.pk).update(
        state=Provisioning.State.WAITING,
        inserted_at=now,
        reset_at=now + timedelta(seconds=3),
        reset_type="ForceRestart",
    )
    expect(panel.locator(".step-current")).to_contain_text(
        "Waiting for the hypervisor", timeout=POLL
    )
    expect(panel.locator(".step-done")).to_have_count(2)
    screenshot(page, "node-provisioning")

    Provisioning.objects.filter(pk=run.pk).update(
        state=Provisioning.State.DONE,
        answered_at=now + timedelta(minutes=6),
        finished_at=now + timedelta(minutes=6),
        message="booted from the image: its hypervisor answered at 10:08 UTC; the image was "
        "still inserted and is ejected now",
    )
    expect(panel.get_by_role("status")).to_contain_text("Done: booted from the image", timeout=POLL)
    expect(panel.get_by_role("button", name="Boot from image")).to_be_visible()


def test_on_a_phone_the_panel_fits_the_screen(browser, live_server, operator, node):
    context = browser.new_context(base_url=live_server.url, viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        log_in(page, operator.username)
        page.goto("/fleet/nodes/east/a100-001/")
        panel = page.locator("#node-provisioning")
        panel.scroll_into_view_if_needed()
        expect(panel.get_by_role("button", name="Boot from image")).to_be_visible()
        box = panel.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390, box
        screenshot(page, "phone-node-provisioning")
    finally:
        context.close()
