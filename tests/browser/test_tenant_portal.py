"""The tenant flow in a real browser (issue 8): a tenant member signs in, requests a spot VM
through the page, watches it run on their portal (a REAL Celery worker places and boots it
through the simulated driver), an operator reclaims it, and the member sees the reclaim
notice counting down on their portal. Then the admin invites a colleague, who accepts from the
mailed link, and an operator looks at the portal read-only. Screenshots go to artifacts/screens/."""

import re

import pytest
from django.core import mail
from playwright.sync_api import expect
from rest_framework.test import APIClient

from gpucap.fleet import services as fleet
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services as plans
from gpucap.rentals.models import VirtualMachine
from gpucap.tenancy.models import Membership
from tests.browser.conftest import log_in, screenshot
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.vm_helpers import IMAGE, SSH_KEY

pytestmark = pytest.mark.django_db(transaction=True)

celery_queue = rentals_fixtures.celery_queue
sim = rentals_fixtures.sim
workers = rentals_fixtures.workers


@pytest.fixture
def h100(celery_queue, fleet_east, settings, operator):
    """h100-east enforcing (every plan applied at once), VMs that boot in half a second, a
    120-second notice. Made after the test queue is emptied: the replans it asks for stay
    queued for the worker (a purged one would hold the set's debounce claim)."""
    settings.PLANS_DEBOUNCE_SECONDS = 1
    cluster = fleet_east["cluster"]
    cluster.driver_settings = {"boot_seconds": 0.5}
    cluster.save(update_fields=["driver_settings"])
    capacity_set = fleet.capacity_set_update(
        capacity_set=fleet_east["sets"]["h100-east"], notice_seconds=120
    )
    return plans.capacity_set_set_mode(capacity_set=capacity_set, mode="enforce", actor=operator)


def test_member_requests_a_spot_vm_sees_it_run_then_sees_the_reclaim_countdown(
    page, member, operator, tenant, h100, sim, workers
):
    worker = workers(PLANS_DEBOUNCE_SECONDS="1")
    log_in(page, member.username)
    expect(page).to_have_url(re.compile(r"/tenants/acme/$"))
    expect(page.locator("#portal-vms")).to_contain_text("No VMs running or waiting")
    screenshot(page, "tenant-portal-empty")

    page.locator(".portal-links").get_by_role("link", name="My VMs").click()
    option = page.locator("select[name=pool] option", has_text=re.compile(r"^h100-spot ·"))
    page.select_option("select[name=pool]", option.get_attribute("value"))
    page.fill("input[name=name]", "finetune")
    page.fill("input[name=gpu_count]", "2")
    page.select_option("select[name=image]", IMAGE)
    page.fill("textarea[name=ssh_public_key]", SSH_KEY)
    page.get_by_role("button", name="Request VM").click()
    expect(page.locator("#vm-request [role=status]")).to_contain_text("Requested vm-")

    page.get_by_role("link", name="Acme AI").click()
    row = page.locator("#portal-vms tr.vm-row", has_text="finetune")
    expect(row.locator(".vm-state")).to_have_text("Running", timeout=30_000)
    expect(row).to_contain_text(re.compile(r"h100-00[12] · GPUs \d,\d"))
    vm = VirtualMachine.objects.get(name="finetune")
    assert (vm.state, vm.pool.kind, vm.gpu_count) == ("running", "spot", 2), worker.log()
    screenshot(page, "tenant-portal-running")

    # An operator takes the VM back: a reclaim notice with the set's 120 s deadline.
    api = APIClient()
    api.force_authenticate(operator)
    response = api.post(f"/api/vms/{vm.pk}/reclaim/", {"message": "maintenance"}, format="json")
    assert response.status_code == 200, response.data
    notice = InterruptionNotice.objects.get(vm=vm, completed_at=None)
    assert notice.reason == "reclaim"

    # The portal's own poll shows the notice, and the countdown ticks in the browser.
    expect(row.locator(".vm-state")).to_have_text("Notified", timeout=20_000)
    countdown = row.locator(".countdown")
    expect(countdown).to_have_text(re.compile(r"^[12]:\d\d left$"))
    first = countdown.text_content()
    page.wait_for_timeout(1_500)
    assert countdown.text_content() != first, "the countdown should tick"
    expect(row).to_contain_text("reclaim notice")
    screenshot(page, "tenant-portal-notice")


def test_admin_invites_a_colleague_and_an_operator_views_the_portal_read_only(
    browser, live_server, page, member, operator, tenant, fleet_east
):
    log_in(page, member.username)
    page.locator(".portal-links").get_by_role("link", name=re.compile(r"^Members")).click()
    expect(page.locator("h1")).to_have_text("Members")
    page.fill("input[name=email]", "nina@acme.example")
    page.get_by_role("button", name="Invite").click()
    expect(page.locator("#invitation-sent")).to_contain_text("nina@acme.example")
    expect(page.locator("tr.invitation-row")).to_contain_text("nina@acme.example")
    screenshot(page, "tenant-members-invited")
    assert not Membership.objects.filter(user__email="nina@acme.example").exists()
    (message,) = mail.outbox
    url = re.search(r"https?://\S+/invitations/\S+/", message.body).group(0)

    # Nina opens the mailed link in a browser of her own, makes her account and lands in acme.
    nina = browser.new_context(base_url=live_server.url, viewport={"width": 1400, "height": 900})
    nina_page = nina.new_page()
    nina_page.goto(url)
    expect(nina_page.locator("h1")).to_have_text("Join Acme AI")
    nina_page.fill("input[name=username]", "nina")
    nina_page.fill("input[name=password1]", "violet-kettle-orbit-42")
    nina_page.fill("input[name=password2]", "violet-kettle-orbit-42")
    screenshot(nina_page, "invitation-accept")
    nina_page.get_by_role("button", name="Make the account and join").click()
    expect(nina_page.locator("h1")).to_have_text("Acme AI")
    nina.close()
    assert Membership.objects.get(user__username="nina").role == "member"

    # An operator finds the tenant in the list and sees its portal read-only.
    page.get_by_role("button", name="Sign out").click()
    log_in(page, operator.username)
    page.get_by_role("link", name="Tenants", exact=True).click()
    expect(page.locator("tr.tenant-row")).to_have_count(2)
    screenshot(page, "operator-tenants")
    page.get_by_role("link", name="Acme AI").click()
    expect(page.locator(".operator-banner")).to_contain_text(
        "Viewing Acme AI as operator (read-only)."
    )
    expect(page.locator("main form")).to_have_count(0)
    screenshot(page, "operator-tenant-portal")
