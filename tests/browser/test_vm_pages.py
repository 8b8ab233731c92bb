"""The VM pages in a real browser: a tenant member requests a VM through the form, sees it
pending, sees it turn Running by the table's own polling, stops it through the confirmation
dialog; an operator filters every tenant's VMs. No Celery worker runs here: the test moves the
VM along through the services, as a worker would."""

import re

import pytest
from playwright.sync_api import expect

from gpucap.rentals import services
from gpucap.rentals.models import VirtualMachine
from tests.browser.conftest import log_in, screenshot
from tests.rentals.vm_helpers import IMAGE, SSH_KEY, grant_pools, running_vm

pytestmark = pytest.mark.django_db(transaction=True)


def fill_request(page, *, pool: str, name: str, gpus: int) -> None:
    option = page.locator("select[name=pool] option", has_text=re.compile(rf"^{pool} ·"))
    page.select_option("select[name=pool]", option.get_attribute("value"))
    page.fill("input[name=name]", name)
    page.fill("input[name=gpu_count]", str(gpus))
    page.select_option("select[name=image]", IMAGE)
    page.fill("textarea[name=ssh_public_key]", SSH_KEY)
    page.get_by_role("button", name="Request VM").click()


def test_member_requests_a_vm_and_watches_it_start(
    page, member, operator, tenant, other_tenant, fleet_east
):
    grant_pools(fleet_east, tenant, other_tenant)
    log_in(page, member.username)
    page.get_by_role("link", name="My VMs").first.click()
    expect(page).to_have_url(re.compile(r"/tenants/acme/vms/$"))
    expect(page.locator("#vm-table")).to_contain_text("No VMs running or waiting")

    # A GPU count the fabric cannot give: refused next to the field, nothing requested.
    fill_request(page, pool="a100-standalone", name="train-01", gpus=3)
    error = page.locator("#id_gpu_count-error")
    expect(error).to_contain_text("NVSwitch sets allocate whole partitions of 1, 2, 4 or 8 GPUs")
    expect(page.locator("input[name=name]")).to_have_value("train-01")
    expect(page.locator("nav.nav")).to_contain_text("My VMs")  # the page, menu and all, stays
    assert not VirtualMachine.objects.exists()
    screenshot(page, "tenant-vm-request-refused")

    page.fill("input[name=gpu_count]", "2")
    page.get_by_role("button", name="Request VM").click()
    expect(page.locator("#vm-request [role=status]")).to_contain_text("Requested vm-")
    row = page.locator("#vm-table tr.vm-row", has_text="train-01")
    expect(row.locator(".vm-state")).to_have_text("Pending")
    expect(row).to_contain_text("waiting for capacity")
    vm = VirtualMachine.objects.get(name="train-01")
    assert (vm.state, vm.gpu_count, vm.tenant) == ("pending", 2, tenant)
    screenshot(page, "tenant-vm-requested")

    # An operator places it by hand and the driver reports it booted; the table's poll shows it.
    services.vm_place(
        vm=vm, node=fleet_east["nodes"]["a100-001"], gpu_indices=[2, 3], actor=operator
    )
    services.vm_mark_running(vm=vm, ip_address="10.20.0.7")
    expect(row.locator(".vm-state")).to_have_text("Running", timeout=8_000)
    expect(row).to_contain_text("a100-001 · GPUs 2,3")
    expect(row).to_contain_text("10.20.0.7")
    screenshot(page, "tenant-vms-running")

    row.get_by_role("link", name="train-01").click()
    expect(page.locator("h1")).to_contain_text("train-01")
    expect(page.get_by_role("button", name="Start")).to_have_count(0)
    screenshot(page, "tenant-vm-detail")
    messages = []
    page.once("dialog", lambda dialog: (messages.append(dialog.message), dialog.accept()))
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#vm-live .state-line .vm-state")).to_have_text("Stopping")
    assert messages and messages[0].startswith(f"Stop {vm.instance_id} (train-01)?")
    vm.refresh_from_db()
    assert (vm.state, vm.stop_reason) == ("stopping", "owner")
    screenshot(page, "tenant-vm-stopping")


def test_member_sees_a_refused_action_in_place(page, member, tenant, other_tenant, fleet_east):
    pools = grant_pools(fleet_east, tenant, other_tenant)
    vm = running_vm(
        tenant,
        pools["a100-standalone"],
        fleet_east["nodes"]["a100-001"],
        [0],
        name="web",
        ip="10.20.0.8",
    )
    log_in(page, member.username)
    page.goto(f"/vms/{vm.pk}/")
    # Someone else stops it between the page load and the click.
    services.vm_stop(vm=vm)
    services.vm_mark_stopped(vm=vm)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#vm-live [role=alert]")).to_have_text(
        f"Not changed: {vm.instance_id} is stopped; it cannot become stopping"
    )
    expect(page.get_by_role("button", name="Start")).to_be_visible()
    screenshot(page, "tenant-vm-refused-action")


def test_operator_filters_every_tenants_vms(page, operator, tenant, other_tenant, fleet_east):
    pools = grant_pools(fleet_east, tenant, other_tenant)
    nodes = fleet_east["nodes"]
    running_vm(
        tenant, pools["a100-standalone"], nodes["a100-001"], [0, 1], name="a-run", ip="10.0.0.3"
    )
    services.vm_request(
        tenant=tenant,
        pool=pools["h100-spot"],
        name="a-wait",
        gpu_count=8,
        image=IMAGE,
        ssh_public_key=SSH_KEY,
    )
    running_vm(
        other_tenant, pools["l40s-ondemand"], nodes["l40s-001"], [2], name="g-run", ip="10.0.0.4"
    )
    log_in(page, operator.username)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="VMs").click()
    expect(page.locator("h1")).to_have_text("VMs")
    expect(page.locator("tr.vm-row")).to_have_count(3)
    screenshot(page, "operator-vms")

    page.select_option("select[name=tenant]", "globex")
    expect(page).to_have_url(re.compile(r"tenant=globex"))
    expect(page.locator("tr.vm-row")).to_have_count(1)
    expect(page.locator("tr.vm-row")).to_contain_text("g-run")
    page.select_option("select[name=tenant]", "")
    page.select_option("select[name=state]", "pending")
    expect(page).to_have_url(re.compile(r"\?state=pending$"))
    expect(page.locator("tr.vm-row")).to_have_count(1)
    expect(page.locator("tr.vm-row")).to_contain_text("a-wait")
    screenshot(page, "operator-vms-filtered")

    page.get_by_role("link", name="a-wait").click()
    expect(page.locator("#vm-live")).to_contain_text("vm.request")
    screenshot(page, "operator-vm-detail")
