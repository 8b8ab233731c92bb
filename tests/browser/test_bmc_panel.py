"""The node page's BMC panel in a real browser (issue 20), with a REAL Celery worker: the panel
shows how gpucap reaches the emulated GPU server's BMC ("TLS not verified" in red) and the
inventory it gave; the failed card has been swapped for a healthy one, so Rediscover (the
worker reads the BMC while the panel polls) previews "GPU 5 health failed -> ok", and Apply,
through its confirmation, has the worker read it again and apply it. A credentials form half
typed while the panel polls is left as it was. Screenshots at desktop and phone width are
saved."""

import json

import pytest
from playwright.sync_api import expect

from gpucap.bmc.discovery import DiscoveryEntry, discovery_run
from gpucap.bmc.services import bmc_credential_set
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node
from tests.bmc.conftest import TEST_KEY
from tests.bmc.emulators import StaticBmc, mockup_copy
from tests.browser.conftest import log_in, screenshot
from tests.rentals import conftest as rentals_fixtures

pytestmark = pytest.mark.django_db(transaction=True)

celery_queue = rentals_fixtures.celery_queue
workers = rentals_fixtures.workers


@pytest.fixture
def bmc(tmp_path):
    """The emulated GPU server, from a copy of the mockup the test may change."""
    with StaticBmc(mockup_copy(tmp_path / "gpu-server")) as server:
        yield server


@pytest.fixture
def node(settings, bmc) -> Node:
    settings.BMC_CREDENTIAL_KEYS = [TEST_KEY]
    fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)
    entry = DiscoveryEntry(
        where="entries[0]",
        cluster="east",
        address=bmc.url,
        username="admin",
        password="s3cret-bmc-password",
        fabric="nvswitch",
        gpu_model="H100-SXM5-80GB",
    )
    discovery_run(entries=[entry], dry_run=False)
    node = Node.objects.get(hostname="h100-001")
    bmc_credential_set(node=node, username="admin", password=None, verify_tls=False)
    return node


def test_rediscover_previews_and_applies_through_a_worker(page, operator, node, bmc, workers):
    worker = workers(BMC_CREDENTIAL_KEYS=TEST_KEY)
    # The card in SXM6 (the host's GPU 5) was swapped for a healthy one.
    card = bmc.mockup / "Systems" / "1" / "Processors" / "GPU_SXM_6" / "index.json"
    card.write_text(json.dumps({**json.loads(card.read_text()), "Status": {"Health": "OK"}}))

    log_in(page, operator.username)
    page.goto("/fleet/nodes/east/h100-001/")
    panel = page.locator("#node-bmc")
    expect(panel.locator(".tls-off")).to_have_text("TLS not verified")
    expect(panel.locator(".password-set")).to_contain_text("password set (updated")
    expect(panel).to_contain_text("Contoso GS-8H100")
    expect(panel.locator("tr.bmc-gpu")).to_have_count(8)
    expect(panel.locator("tr.bmc-gpu").nth(5)).to_contain_text("BMC: Critical")

    panel.get_by_role("button", name="Rediscover").click()
    expect(panel.locator(".discovery")).to_be_visible()
    # An operator starts changing the credentials while the BMC is read: the panel's polls
    # leave the half-typed form as it is.
    panel.locator(".bmc-credentials summary").click()
    panel.locator(".bmc-credentials-form input[name=username]").fill("typed-while-polling")
    lines = panel.locator(".change-lines")
    expect(lines).to_contain_text(
        "would update node east/h100-001: GPU 5 health failed -> ok (BMC: OK); inventory changed",
        timeout=60_000,  # the worker reads the BMC; the panel polls every 2 s
    )
    expect(panel.get_by_role("button", name="Apply")).to_be_visible()
    expect(panel.locator(".bmc-credentials-form input[name=username]")).to_have_value(
        "typed-while-polling"
    )
    panel.locator(".bmc-credentials summary").click()
    screenshot(page, "node-bmc-panel")

    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page, "node-bmc-panel-phone")
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px on a phone"
    page.set_viewport_size({"width": 1400, "height": 900})

    page.once("dialog", lambda dialog: dialog.accept())
    panel.get_by_role("button", name="Apply").click()
    expect(panel.locator(".alert-ok")).to_contain_text(
        "updated 1 node, unchanged 0", timeout=60_000
    )
    expect(panel.locator("tr.bmc-gpu").nth(5)).to_contain_text("BMC: OK")
    assert node.gpus.get(index=5).health == "ok", worker.log()
