"""The smaller defects of issue 15, measured in a real browser: billing's checkboxes beside their
labels, state badges that read as labels rather than buttons, names that never wrap at their
hyphens, and a node page that fits a phone."""

import pytest
from playwright.sync_api import expect

from gpucap.rentals import services
from tests.browser.conftest import log_in, screenshot
from tests.rentals.vm_helpers import IMAGE, SSH_KEY, grant_pools, running_vm

pytestmark = pytest.mark.django_db(transaction=True)


def box(locator) -> dict:
    return locator.bounding_box()


def test_billing_checkboxes_sit_beside_their_labels_and_say_what_ticking_does(page, operator):
    log_in(page, operator.username)
    page.goto("/usage/billing/")
    for name, label in (("enabled", "Push usage records"), ("generate_secret", "Generate a new")):
        checkbox = page.locator(f"#billing-settings input[name={name}]")
        text = page.locator(f"#billing-settings label[for=id_{name}]")
        expect(text).to_contain_text(label)
        assert text.evaluate("(label, box) => label.contains(box)", checkbox.element_handle())
        checkbox_box, label_box = box(checkbox), box(text)
        # On the label's line, at its start: not a row of its own, not across the column.
        assert abs(checkbox_box["y"] - label_box["y"]) < label_box["height"]
        assert checkbox_box["x"] - label_box["x"] < 4
        assert checkbox_box["width"] < 30
    push = page.locator("#billing-settings .field-enabled")
    expect(push.locator("input[type=checkbox]")).to_be_checked()  # a new webhook pushes
    expect(push.locator(".help")).to_contain_text("Ticked: new records are sent")
    expect(push.locator(".help")).not_to_contain_text("Off: nothing is sent.")
    screenshot(page, "billing-settings")


def test_state_badges_read_as_labels_not_buttons(page, operator, tenant, other_tenant, fleet_east):
    pools = grant_pools(fleet_east, tenant, other_tenant)
    running_vm(
        tenant,
        pools["a100-standalone"],
        fleet_east["nodes"]["a100-001"],
        [0],
        name="web",
        ip="10.0.0.9",
    )
    log_in(page, operator.username)
    page.goto("/vms/")
    badge = page.locator(".vm-state").first
    button = page.get_by_role("button", name="Filter")
    style = """el => { const s = getComputedStyle(el); return {
        cursor: s.cursor, border: s.borderTopColor, radius: parseFloat(s.borderTopLeftRadius),
        shadow: s.boxShadow, height: el.getBoundingClientRect().height }; }"""
    label, real = badge.evaluate(style), button.evaluate(style)
    assert label["cursor"] != "pointer" and label["shadow"] == "none"
    assert label["border"] == "rgba(0, 0, 0, 0)"  # no frame, where a button has one
    assert real["border"] != "rgba(0, 0, 0, 0)"
    assert label["radius"] >= label["height"] / 2 > real["radius"]  # a pill, not a box
    page.goto("/fleet/nodes/east/a100-001/")
    node_state = page.locator(".state-badge").first.evaluate(style)
    assert node_state["border"] == "rgba(0, 0, 0, 0)" and node_state["cursor"] != "pointer"
    assert node_state["radius"] >= node_state["height"] / 2


def test_names_never_wrap_at_their_hyphens_while_reasons_do(
    page, operator, tenant, other_tenant, fleet_east
):
    pools = grant_pools(fleet_east, tenant, other_tenant)
    services.vm_request(
        tenant=tenant,
        pool=pools["h100-spot"],
        name="h100-spot-train-run-0001",
        gpu_count=8,
        image=IMAGE,
        ssh_public_key=SSH_KEY,
    )
    page.set_viewport_size({"width": 1000, "height": 800})
    log_in(page, operator.username)
    page.goto("/vms/")
    row = page.locator("tr.vm-row").first
    for name in (row.locator("a.vm-name"), row.locator("td.pool-name")):
        expect(name).to_be_visible()
        assert name.evaluate("el => getComputedStyle(el).whiteSpace") == "nowrap"
        lines = name.evaluate(
            "el => { const r = document.createRange(); r.selectNodeContents(el.firstChild);"
            " return new Set(Array.from(r.getClientRects(), (x) => Math.round(x.top))).size; }"
        )
        assert lines == 1, f"{name} wraps"
    reason = row.locator(".vm-waiting")
    expect(reason).to_be_visible()
    assert reason.evaluate("el => getComputedStyle(el).whiteSpace") == "normal"
    screenshot(page, "vm-names-unwrapped")


def test_the_node_page_fits_a_phone(page, operator, tenant, other_tenant, fleet_east):
    pools = grant_pools(fleet_east, tenant, other_tenant)
    running_vm(
        tenant,
        pools["a100-standalone"],
        fleet_east["nodes"]["a100-001"],
        [0, 1],
        name="a-long-training-run-name",
        ip="10.0.0.10",
    )
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, operator.username)
    page.goto("/fleet/nodes/east/a100-001/")
    expect(page.locator("table.gpu-table")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    scroller = page.locator(".gpu-table-scroll")
    # The table is wider than the phone: it scrolls inside its card.
    assert scroller.evaluate("el => el.scrollWidth > el.clientWidth")
    screenshot(page, "node-phone")
