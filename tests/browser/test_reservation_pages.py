"""Reservations in a real browser (issue 19): globex's spot VMs fill h100-east, which enforces
its plans. The operator reserves 16 GPUs in blocks of 8 for acme on the set page: a bad value
is refused next to its field, the preview names globex's spot VMs that would get notices and
stores nothing, Approve keeps it, and the section lists those VMs as borrowing. acme's member
asks for an 8-GPU VM on the portal; the plan notifies the borrowers, and once they stop acme's
VM lands inside its reservation, which the set page shows held."""

import pytest
from playwright.sync_api import expect

from gpucap.allocation.models import Reservation
from gpucap.fleet import services as fleet
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services as plans
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.allocation.reservation_fleet import BATCH, globex_spots_fill
from tests.browser.conftest import log_in, screenshot
from tests.rentals.vm_helpers import SSH_KEY

pytestmark = pytest.mark.django_db(transaction=True)

SET_PAGE = "/fleet/sets/h100-east/"


@pytest.fixture
def h100(fleet_east, operator):
    capacity_set = fleet.capacity_set_update(
        capacity_set=fleet_east["sets"]["h100-east"], notice_seconds=120
    )
    return plans.capacity_set_set_mode(capacity_set=capacity_set, mode="enforce", actor=operator)


@pytest.fixture
def globex_spots(h100, fleet_east, tenant, other_tenant) -> list[VirtualMachine]:
    """globex's four running 4-GPU spot VMs filling both nodes; acme may rent on-demand."""
    return globex_spots_fill(fleet_east, tenant, other_tenant, ips="10.62.0")


def _form(page):
    page.locator("#reservation-form summary").click()
    form = page.locator("form.reservation-form")
    form.locator("select[name=tenant]").select_option("acme")
    form.locator("input[name=name]").fill("acme-16")
    form.locator("select[name=block_gpus]").select_option("8")
    form.locator("input[name=when][value=always]").check()
    return form


def test_the_operator_reserves_gpus_and_acme_s_request_lands_inside(
    browser, live_server, operator, member, tenant, h100, fleet_east, globex_spots
):
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    log_in(page, operator.username)
    page.goto(SET_PAGE)
    expect(page.locator("#set-reservations .empty")).to_contain_text("No reservations")

    # More GPUs than the set has: refused next to the field, nothing stored.
    form = _form(page)
    form.locator("input[name=gpus]").fill("24")
    form.locator("button[type=submit]").click()
    expect(page.locator("#reservation_gpus-error")).to_contain_text(
        "24 GPUs is more than capacity set h100-east has: 16 GPUs"
    )
    screenshot(page, "reservation-form-error")
    assert not Reservation.objects.exists()

    # The preview names globex's spot VMs that would get notices; nothing is stored.
    page.locator("form.reservation-form input[name=gpus]").fill("16")
    page.locator("form.reservation-form button[type=submit]").click()
    preview = page.locator("#reservation-preview")
    expect(preview).to_contain_text("a preview: nothing is stored")
    expect(preview).to_contain_text(
        "These VMs borrow the capacity and would get notices (120 s, the set's notice period) "
        "when acme claims it"
    )
    expect(preview.locator(".notice-row")).to_have_count(4)
    for name in BATCH:
        expect(preview).to_contain_text(name)
    screenshot(page, "reservation-preview")
    assert not Reservation.objects.exists()

    preview.get_by_role("button", name="Approve").click()
    expect(page.locator("#set-reservations .alert-ok")).to_contain_text(
        "Reserved 16 GPUs of h100-east for acme (acme-16)."
    )
    reservation = Reservation.objects.get()
    assert (reservation.gpus, reservation.block_gpus, reservation.always) == (16, 8, True)
    assert not InterruptionNotice.objects.exists()  # nobody is warned until acme claims it

    # The set is planned with it (as its worker would): globex's VMs borrow the kept GPUs.
    plans.capacity_set_tick(capacity_set_id=h100.pk)
    page.reload()
    row = page.locator(f"#reservation-{reservation.pk}")
    for name in BATCH:
        expect(row.locator(".borrowed")).to_contain_text(name)
    expect(row.locator(".claims li")).to_have_count(4)
    expect(row.locator(".held")).to_have_text("0 / 16")
    screenshot(page, "reservations-section")
    context.close()

    phone = browser.new_context(base_url=live_server.url, viewport={"width": 390, "height": 844})
    page = phone.new_page()
    page.set_default_timeout(15_000)
    log_in(page, operator.username)
    page.goto(SET_PAGE)
    expect(page.locator(f"#reservation-{reservation.pk} .borrowed")).to_contain_text("batch-1")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    screenshot(page, "reservations-section-phone")
    phone.close()

    # acme's member asks for an 8-GPU on-demand VM on the portal.
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    log_in(page, member.username)
    page.goto("/tenants/acme/vms/")
    form = page.locator("form.stacked-form")
    form.locator("select[name=pool]").select_option(str(fleet_east["pools"]["h100-ondemand"].pk))
    form.locator("input[name=name]").fill("train-1")
    form.locator("input[name=gpu_count]").fill("8")
    form.locator("textarea[name=ssh_public_key], input[name=ssh_public_key]").fill(SSH_KEY)
    form.locator("button[type=submit]").click()
    expect(page.get_by_text("train-1").first).to_be_visible()
    train = VirtualMachine.objects.get(tenant=tenant, name="train-1")
    page.goto("/tenants/acme/")
    expect(page.locator("#portal-reservations")).to_contain_text("h100-east")
    expect(page.locator("#portal-reservations .held")).to_have_text("0 / 16")
    expect(page.locator("#portal-reservations")).not_to_contain_text("batch-1")
    context.close()

    # The plan claims acme's reservation: two borrowers on one node get notices; once their
    # deadline passes and the driver reports them off, train-1 is placed inside it.
    plan = plans.capacity_set_tick(capacity_set_id=h100.pk).plan
    victims = [n.vm for n in InterruptionNotice.objects.filter(plan=plan).select_related("vm")]
    assert len(victims) == 2 and {vm.tenant.slug for vm in victims} == {"globex"}
    for victim in victims:
        stopping = rentals.vm_stop_for_notice(vm=victim, message="arbiter notice deadline reached")
        rentals.vm_mark_stopped(vm=stopping)
    tick = plans.capacity_set_tick(capacity_set_id=h100.pk)  # what the worker runs next
    assert tick.placed_waiting == [train.pk]
    train.refresh_from_db()
    assert train.node_id == victims[0].node_id and train.reservation_id == reservation.pk

    context = browser.new_context(base_url=live_server.url, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    log_in(page, operator.username)
    page.goto(SET_PAGE)
    expect(page.locator(f"#reservation-{reservation.pk} .held")).to_have_text("8 / 16")
    context.close()
