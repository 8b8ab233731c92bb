"""The operators' BMC forms in a real browser (issue 20): the node page's credentials form (a bad
system id told next to its field, the password never filled back, TLS verification turned off
shown in red, Remove after its confirmation); the cluster page's "Discover machines" (a row
added, a missing password told next to its field, then a REAL Celery worker reads the emulated
GPU server while the panel polls, the preview, Apply through its confirmation, the node
created); the cluster's recovery policy (a value out of range told next to its field, turning
the automatic power cycle on confirmed, then shown). Screenshots at desktop (1400 px) and phone
(390 px) width; on a phone nothing scrolls sideways."""

import pytest
from playwright.sync_api import Page, expect

from gpucap.bmc.models import BmcCredential
from gpucap.bmc.passwords import password_open
from gpucap.bmc.recovery_models import RecoveryPolicy
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node
from tests.bmc.conftest import TEST_KEY
from tests.bmc.emulators import StaticBmc
from tests.browser.conftest import log_in, screenshot
from tests.rentals import conftest as rentals_fixtures

pytestmark = pytest.mark.django_db(transaction=True)

celery_queue = rentals_fixtures.celery_queue
workers = rentals_fixtures.workers

PASSWORD = "s3cret-bmc-password"


@pytest.fixture
def east(settings) -> Cluster:
    settings.BMC_CREDENTIAL_KEYS = [TEST_KEY]
    return fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)


def both_widths(page: Page, name: str) -> None:
    """Screenshots at desktop and phone width; on a phone nothing scrolls sideways."""
    screenshot(page, name)
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page, f"{name}-phone")
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px on a phone"
    page.set_viewport_size({"width": 1400, "height": 900})


def test_the_credentials_form_on_the_node_page(page, operator, east):
    node = fleet.node_create(
        cluster=east,
        hostname="h100-001",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
        bmc_address="https://10.0.0.5",
    )
    log_in(page, operator.username)
    page.goto("/fleet/nodes/east/h100-001/")
    panel = page.locator("#node-bmc")
    form = panel.locator("form.bmc-credentials-form")
    expect(form).to_be_visible()  # no credentials yet: the form is open

    form.get_by_label("User").fill("admin")
    form.get_by_label("Password").fill(PASSWORD)
    form.get_by_label("System id").fill("System 1")
    form.get_by_label("Verify the BMC's TLS certificate").uncheck()
    form.get_by_role("button", name="Save credentials").click()
    expect(panel.locator(".field-system_id .field-error")).to_have_text(
        "System id: must be a Redfish id: letters, digits, '.', '_' and '-' (at most 64)"
    )
    expect(panel.get_by_label("Password")).to_have_value("")  # never filled back
    assert not BmcCredential.objects.exists()
    both_widths(page, "node-bmc-credentials-error")

    panel.get_by_label("Password").fill(PASSWORD)
    panel.get_by_label("System id").fill("1")
    panel.get_by_role("button", name="Save credentials").click()
    expect(panel.locator(".bmc-notice")).to_have_text("Credentials saved.")
    expect(panel.locator(".password-set")).to_contain_text("password set (updated")
    expect(panel.locator("dd .tls-off")).to_have_text("TLS not verified")
    expect(panel.locator("dd .tls-off")).to_have_css("color", "rgb(224, 49, 49)")
    credential = BmcCredential.objects.get(node=node)
    assert password_open(credential.password_sealed, node="h100-001") == PASSWORD
    assert (credential.username, credential.verify_tls, credential.system_id) == (
        "admin",
        False,
        "1",
    )
    panel.locator("summary", has_text="Change credentials").click()
    both_widths(page, "node-bmc-credentials")

    page.once("dialog", lambda dialog: dialog.accept())
    panel.get_by_role("button", name="Remove credentials").click()
    expect(panel.locator(".bmc-notice")).to_have_text("Credentials removed.")
    assert not BmcCredential.objects.exists()
    assert Node.objects.get(pk=node.pk).bmc_address == "https://10.0.0.5"


def test_discover_machines_from_the_cluster_page(page, operator, east, workers):
    worker = workers(BMC_CREDENTIAL_KEYS=TEST_KEY)
    log_in(page, operator.username)
    page.goto("/fleet/clusters/east/")
    panel = page.locator("#cluster-discovery")
    expect(panel.get_by_role("heading", name="Discover machines")).to_be_visible()
    panel.get_by_role("button", name="Add another BMC").click()
    expect(panel.locator("fieldset.discovery-row")).to_have_count(2)

    with StaticBmc() as bmc:
        first = panel.locator("fieldset.discovery-row").first
        first.get_by_label("BMC address").fill(bmc.url)
        first.get_by_label("User").fill("admin")
        first.get_by_label("GPU model").fill("H100-SXM5-80GB")
        first.get_by_label("Fabric").select_option("nvswitch")
        panel.get_by_role("button", name="Discover", exact=True).click()
        expect(first.locator(".field-password .field-error")).to_have_text("Password: is required")
        expect(panel.locator("fieldset.discovery-row")).to_have_count(1)  # the empty row left out
        expect(panel.locator(".discovery-passwords")).to_contain_text("type them again")
        first.get_by_label("Password").fill(PASSWORD)
        panel.get_by_role("button", name="Discover", exact=True).click()

        lines = panel.locator(".change-lines")
        expect(lines).to_contain_text(
            "would create node east/h100-001: 8 x H100-SXM5-80GB nvswitch",
            timeout=60_000,  # the worker reads the BMC; the panel polls every 2 s
        )
        expect(panel.get_by_role("button", name="Apply")).to_be_visible()
        expect(panel.locator(".discovery-list tr.discovery-listed")).to_have_count(1)
        both_widths(page, "cluster-discovery")

        page.once("dialog", lambda dialog: dialog.accept())
        panel.get_by_role("button", name="Apply").click()
        expect(panel.locator(".alert-ok")).to_contain_text("created 1 node", timeout=60_000)
    expect(panel.locator(".discovery-state-applied")).to_have_text("Applied")
    node = Node.objects.get(hostname="h100-001")
    assert node.gpus.count() == 8, worker.log()
    assert BmcCredential.objects.filter(node=node).exists()


def test_the_recovery_policy_on_the_cluster_page(page, operator, east):
    log_in(page, operator.username)
    page.goto("/fleet/clusters/east/")
    panel = page.locator("#cluster-recovery")
    expect(panel.locator(".recovery-policy-now")).to_contain_text("Manual")

    panel.get_by_label("Max attempts").fill("50")
    panel.get_by_role("button", name="Save policy").click()
    expect(panel.locator(".field-max_attempts .field-error")).to_have_text(
        "Max attempts: must be between 1 and 20, got 50"
    )
    both_widths(page, "cluster-recovery-policy-error")

    panel.get_by_label("Max attempts").fill("5")
    panel.get_by_label("Grace (seconds)").fill("300")
    panel.get_by_label("Power-cycle down nodes automatically").check()
    panel.get_by_role("button", name="Save policy").click()
    expect(panel.locator(".policy-confirm")).to_contain_text(
        "Turn on automatic power cycles for east?"
    )
    assert not RecoveryPolicy.objects.exists()  # nothing saved before the confirmation
    both_widths(page, "cluster-recovery-policy-confirm")

    panel.get_by_role("button", name="Turn on automatic power cycles").click()
    expect(panel.locator(".policy-saved")).to_have_text("Recovery policy saved.")
    expect(panel.locator(".recovery-policy-now")).to_contain_text(
        "Automatic A node down for 300 s is power-cycled through its BMC"
    )
    saved = RecoveryPolicy.objects.get(cluster=east)
    assert (saved.auto_power_cycle, saved.grace_seconds, saved.max_attempts) == (True, 300, 5)
