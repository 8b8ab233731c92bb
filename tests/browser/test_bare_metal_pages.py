"""A tenant's machines rented whole, in a real browser (issue 20): the member signs in, opens
Machines from the portal, powers the machine off through its confirmation dialog, and the page
follows by its own polling while a REAL Celery worker asks sushy-emulator's fake system, whose
power really changes a few seconds later; then re-images it from the catalogue (the emulator
fetches the image from a server on loopback, the machine boots from it) and watches it go to
the installer; then on a phone. Screenshots go to artifacts/screens/."""

import pytest
from playwright.sync_api import expect

from gpucap.bmc.services import bmc_target
from gpucap.bmc.vmedia import virtual_media_eject
from tests.bmc.bare_metal_helpers import catalogue_image, dedicated, rent
from tests.bmc.conftest import TEST_KEY
from tests.bmc.emulators import DynamicBmc
from tests.bmc.media import ImageServer, tiny_iso
from tests.browser.conftest import log_in, screenshot
from tests.rentals import conftest as rentals_fixtures

pytestmark = pytest.mark.django_db(transaction=True)

celery_queue = rentals_fixtures.celery_queue
workers = rentals_fixtures.workers


@pytest.fixture
def machine(settings, celery_queue, fleet_east, tenant, operator, tmp_path):
    """acme rents a100-001 whole; sushy-emulator's fake system is its BMC, switched on; the
    cluster's catalogue offers two images served on loopback."""
    settings.BMC_CREDENTIAL_KEYS = [TEST_KEY]
    tiny_iso(tmp_path / "ubuntu-24.04.iso")
    tiny_iso(tmp_path / "rocky-9.iso")
    with DynamicBmc() as bmc, ImageServer(tmp_path) as images:
        node = dedicated(fleet_east["nodes"]["a100-001"], tenant, bmc=bmc, operator=operator)
        virtual_media_eject(bmc_target(node))
        cluster = fleet_east["cluster"]
        image = catalogue_image(
            cluster,
            description="Ubuntu 24.04 LTS server",
            image_url=images.url_of("ubuntu-24.04.iso"),
        )
        catalogue_image(
            cluster,
            name="rocky-9",
            description="Rocky Linux 9",
            image_url=images.url_of("rocky-9.iso"),
        )
        yield bmc, images, rent(node, tenant, image=image, actor=operator)


def test_a_member_powers_its_machine_off_and_the_page_follows(
    page, browser, live_server, member, machine, workers
):
    bmc, images, rental = machine
    worker = workers(BMC_CREDENTIAL_KEYS=TEST_KEY)
    log_in(page, member.username)
    page.locator(".portal-links").get_by_role("link", name="Machines").click()
    expect(page.locator("h1")).to_have_text("Machines")
    card = page.locator(f"#machine-{rental.pk}")
    # The power read sent when it was rented, shown by the page's poll.
    expect(card.locator(".machine-power")).to_have_text("Power on", timeout=60_000)

    messages = []
    page.once("dialog", lambda dialog: (messages.append(dialog.message), dialog.accept()))
    card.get_by_role("button", name="Power off").click()

    assert messages and messages[0].startswith("Power a100-001 off?")
    expect(card.locator(".machine-action")).to_contain_text("Power off asked at")
    expect(card.get_by_role("button", name="Power on")).to_be_disabled()
    expect(card.locator(".machine-action")).to_contain_text(
        "done: the machine is off", timeout=90_000
    )
    expect(card.locator(".machine-power")).to_have_text("Power off")
    expect(card.get_by_role("button", name="Power on")).to_be_enabled()

    messages.clear()
    page.once("dialog", lambda dialog: (messages.append(dialog.message), dialog.accept()))
    card.locator("select[name=image]").select_option(label="rocky-9 — Rocky Linux 9")
    card.get_by_role("button", name="Re-image").click()

    assert messages and messages[0].startswith("Re-image a100-001 from the image you picked?")
    progress = card.locator(".reimage-progress")
    expect(progress).to_contain_text("rocky-9, asked at")
    expect(progress).to_have_attribute("data-state", "waiting", timeout=90_000)
    expect(progress).to_contain_text("installing: the machine booted from rocky-9")
    expect(card.get_by_role("button", name="Re-image")).to_be_disabled()
    # It was off: the run switched it on to boot from the image, and the page says so.
    expect(card.locator(".machine-power")).to_have_text("Power on", timeout=60_000)
    assert "/rocky-9.iso" in images.fetched, worker.log()
    text = page.content()
    for secret in (bmc.url, bmc.username, bmc.password, images.url):
        assert secret not in text, worker.log()
    screenshot(page, "tenant-bare-metal")

    context = browser.new_context(base_url=live_server.url, viewport={"width": 390, "height": 844})
    phone = context.new_page()
    phone.set_default_timeout(10_000)
    try:
        log_in(phone, member.username)
        phone.goto("/tenants/acme/machines/")
        expect(phone.locator(f"#machine-{rental.pk} .reimage-progress")).to_be_visible()
        width = phone.evaluate("document.documentElement.scrollWidth")
        screenshot(phone, "tenant-bare-metal-phone")
        assert width <= 390, f"the machines page is {width} px wide on a 390 px phone"
    finally:
        context.close()
