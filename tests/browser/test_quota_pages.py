"""Quotas in a real browser (issue 19): an operator sets a quota on the quotas page, a bad value
answered in place next to its field; the quota lowered below what the tenant holds says that
nothing is stopped; the tenant's member sees the quota and the use on their portal, and a
request past it on the VM form is refused with the words naming the quota and the VMs."""

import pytest
from playwright.sync_api import expect

from gpucap.allocation.models import TenantQuota
from tests.browser.conftest import log_in, screenshot
from tests.rentals.vm_helpers import SSH_KEY, grant_pools, running_vm

pytestmark = pytest.mark.django_db(transaction=True)


def test_operator_sets_a_quota_and_the_tenant_sees_it_and_is_held_to_it(
    browser, live_server, operator, member, tenant, other_tenant, fleet_east
):
    pools = grant_pools(fleet_east, tenant, other_tenant)
    running_vm(
        tenant,
        pools["h100-spot"],
        fleet_east["nodes"]["h100-001"],
        [0, 1, 2, 3],
        name="train-1",
        ip="10.65.0.1",
    )
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    log_in(page, operator.username)
    page.goto("/fleet/quotas/")
    form = page.locator("#quota-form form")
    form.locator("select[name=tenant]").select_option("acme")
    form.locator("select[name=pool]").select_option("h100-spot")
    form.locator("input[name=max_gpus]").fill("-1")
    form.locator("button[type=submit]").click()
    expect(page.locator("#id_max_gpus-error")).to_contain_text("must be 0 or more")
    assert not TenantQuota.objects.exists()

    form = page.locator("#quota-form form")
    form.locator("input[name=max_gpus]").fill("2")
    form.locator("button[type=submit]").click()
    expect(page.locator("#quotas-panel .alert-warn")).to_contain_text(
        "acme holds 4 GPUs in pool h100-spot (train-1), over the new quota of 2: nothing is stopped"
    )
    expect(page.locator(".quota-row")).to_have_count(1)
    screenshot(page, "quotas-page")
    context.close()

    context = browser.new_context(base_url=live_server.url, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    log_in(page, member.username)
    page.goto("/tenants/acme/")
    expect(page.locator("#portal-quotas")).to_contain_text("pool h100-spot")
    expect(page.locator("#portal-quotas")).to_contain_text("4 / 2")
    screenshot(page, "quotas-portal")

    page.goto("/tenants/acme/vms/")
    form = page.locator("form.stacked-form")
    form.locator("select[name=pool]").select_option(str(pools["h100-spot"].pk))
    form.locator("input[name=name]").fill("more")
    form.locator("input[name=gpu_count]").fill("1")
    form.locator("textarea[name=ssh_public_key], input[name=ssh_public_key]").fill(SSH_KEY)
    form.locator("button[type=submit]").click()
    expect(page.locator("#id_gpu_count-error")).to_contain_text(
        "over acme's quota in pool h100-spot: 2 GPUs; acme holds 4 (train-1) and asks for 1"
    )
    assert not tenant.vms.filter(name="more").exists()
    context.close()
