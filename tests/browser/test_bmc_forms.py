"""The operators' BMC forms in a real browser (issue 20): the node page's credentials form (a bad
system id told next to its field, the password never filled back, TLS verification turned off
shown in red, Remove after its confirmation). Screenshots at desktop (1400 px) and phone (390 px)
width; on a phone nothing scrolls sideways."""

import pytest
from playwright.sync_api import Page, expect

from gpucap.bmc.models import BmcCredential
from gpucap.bmc.passwords import password_open
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node
from tests.bmc.conftest import TEST_KEY
from tests.browser.conftest import log_in, screenshot

pytestmark = pytest.mark.django_db(transaction=True)

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
