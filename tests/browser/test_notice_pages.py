"""Notices in a real browser: an operator reclaims a tenant's running spot VM through the
confirmation dialog; the tenant's notices page picks the notice up by its own polling and counts
down to the deadline in the browser, red in the last 30 seconds and "stopping…" once it passed.
No Celery worker runs here, so nothing is stopped behind the page's back."""

import re

import pytest
from playwright.sync_api import expect

from gpucap.fleet import services as fleet
from gpucap.notices.models import InterruptionNotice
from gpucap.notices.services import notice_issue
from gpucap.rentals import services
from tests.browser.conftest import log_in, screenshot
from tests.rentals.vm_helpers import IMAGE, SSH_KEY

pytestmark = pytest.mark.django_db(transaction=True)

LEFT = re.compile(r"^(\d+):(\d\d) left$")


def running_spot_vm(tenant, pool, node, gpu: int, *, name: str, ip: str):
    vm = services.vm_request(
        tenant=tenant,
        pool=pool,
        name=name,
        gpu_count=1,
        image=IMAGE,
        ssh_public_key=SSH_KEY,
    )
    services.vm_place(vm=vm, node=node, gpu_indices=[gpu])
    return services.vm_mark_running(vm=vm, ip_address=ip)


def seconds_left(text: str) -> int:
    match = LEFT.match(text.strip())
    assert match, f"not a countdown: {text!r}"
    return int(match[1]) * 60 + int(match[2])


def test_tenant_watches_an_operator_reclaim_count_down(
    page, browser, live_server, member, operator, tenant, fleet_east
):
    pools, nodes = fleet_east["pools"], fleet_east["nodes"]
    vm = running_spot_vm(
        tenant, pools["h100-spot"], nodes["h100-001"], 0, name="train-spot", ip="10.30.0.5"
    )

    tenant_context = browser.new_context(
        base_url=live_server.url, viewport={"width": 1400, "height": 900}
    )
    mine = tenant_context.new_page()
    mine.set_default_timeout(10_000)
    log_in(mine, member.username)
    mine.get_by_role("navigation", name="Main").get_by_role("link", name="Notices").click()
    expect(mine).to_have_url(re.compile(r"/notices/$"))
    expect(mine.locator("#open-notices")).to_contain_text("No open notices")

    # The operator reclaims it from the VM page, through the confirmation dialog.
    log_in(page, operator.username)
    page.goto(f"/vms/{vm.pk}/")
    messages = []
    page.once("dialog", lambda dialog: (messages.append(dialog.message), dialog.accept()))
    page.get_by_role("button", name="Reclaim").click()
    expect(page.locator("#vm-notice")).to_contain_text("Interruption notice (reclaim)")
    assert messages and messages[0].startswith(
        f"Reclaim {vm.instance_id} (train-spot) of tenant Acme AI?"
    )
    assert "resumes when capacity returns" in messages[0]
    notice = InterruptionNotice.objects.get(vm=vm, completed_at=None)
    assert notice.reason == "reclaim"
    expect(page.locator("#vm-notice .countdown")).to_have_text(LEFT)
    screenshot(page, "operator-vm-reclaimed")

    # The tenant's list polls every 5 s: the notice arrives without a reload.
    row = mine.locator(f"#notice-{notice.pk}")
    expect(row).to_contain_text("train-spot", timeout=8_000)
    expect(row).to_contain_text(re.compile("reclaimed by an operator", re.IGNORECASE))
    expect(row).not_to_contain_text("olivia")  # not who: a tenant reads of its own VM only
    countdown = row.locator(".countdown")
    expect(countdown).to_have_text(LEFT)
    first = seconds_left(countdown.inner_text())
    assert 110 <= first <= 120
    mine.wait_for_timeout(2_200)
    second = seconds_left(countdown.inner_text())
    assert 1 <= first - second <= 4
    assert "countdown-urgent" not in (countdown.get_attribute("class") or "")
    screenshot(mine, "tenant-notices-countdown")

    # Near the deadline it turns red; past it, it reads "stopping…".
    soon = running_spot_vm(
        tenant, pools["h100-spot"], nodes["h100-001"], 1, name="short-fuse", ip="10.30.0.6"
    )
    soon_notice = notice_issue(vm=soon, reason="reclaim", actor=operator, seconds=4)
    soon_countdown = mine.locator(f"#notice-{soon_notice.pk} .countdown")
    expect(soon_countdown).to_have_class(re.compile(r"countdown-urgent"), timeout=8_000)
    expect(soon_countdown).to_have_text("stopping…", timeout=8_000)
    expect(soon_countdown).to_have_class(re.compile(r"countdown-due"))
    screenshot(mine, "tenant-notices-stopping")

    # The tenant's VM list and the VM page show the same countdown.
    mine.get_by_role("link", name="My VMs").click()
    vm_row = mine.locator(f"#vm-{vm.pk}")
    expect(vm_row.locator(".vm-state")).to_have_text("Notified")
    expect(vm_row.locator(".countdown")).to_have_text(LEFT)
    screenshot(mine, "tenant-vms-notice")
    vm_row.get_by_role("link", name="train-spot").click()
    expect(mine.locator("#vm-notice .countdown")).to_have_text(LEFT)
    expect(mine.get_by_role("button", name="Reclaim")).to_have_count(0)
    screenshot(mine, "tenant-vm-notice")

    # The operator's notices page lists both, with the tenant.
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Notices").click()
    expect(page.locator("#open-notices tr.notice-row")).to_have_count(2)
    expect(page.locator("#open-notices")).to_contain_text("Acme AI")
    screenshot(page, "operator-notices")
    tenant_context.close()


def test_operator_drains_a_node_and_sees_who_holds_it(
    page, operator, tenant, other_tenant, fleet_east
):
    pools, nodes = fleet_east["pools"], fleet_east["nodes"]
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[other_tenant])
    spot = running_spot_vm(
        tenant, pools["h100-spot"], nodes["h100-001"], 0, name="spot-job", ip="10.31.0.1"
    )
    steady = running_spot_vm(
        other_tenant, pools["h100-ondemand"], nodes["h100-001"], 1, name="steady", ip="10.31.0.2"
    )
    log_in(page, operator.username)
    page.goto("/fleet/nodes/east/h100-001/")
    messages = []
    page.once("dialog", lambda dialog: (messages.append(dialog.message), dialog.accept()))
    page.get_by_role("button", name="Drain").click()
    expect(page.locator("#node-live .state-badge")).to_have_text("Draining")
    assert messages == [
        "Drain h100-001? Its spot VMs and inference replicas get 120 s notices; on-demand VMs "
        "keep running and hold the drain."
    ]
    held_up = page.locator("#held-up-by")
    expect(held_up.locator("tr.blocker-row")).to_have_count(2)
    expect(held_up.locator("tr.blocker-on_demand")).to_contain_text("steady")
    expect(held_up.locator("tr.blocker-notice .countdown")).to_have_text(LEFT)
    spot.refresh_from_db()
    steady.refresh_from_db()
    assert (spot.state, steady.state) == ("notified", "running")
    screenshot(page, "operator-node-draining")
