"""The usage pages in a real browser: an operator picks a month, reads the totals and charts
drawn as inline SVG, filters to one tenant and downloads the CSV; the set page loads its GPU
allocation chart. Screenshots go to artifacts/screens/ (usage-*.png)."""

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.sync_api import expect

from gpucap.fleet import services as fleet
from gpucap.rentals import services as rentals
from gpucap.tenancy.models import Tenant
from tests.browser.conftest import log_in, screenshot
from tests.usage import conftest as usage_fixtures

pytestmark = pytest.mark.django_db(transaction=True)

# The usage tests' fixtures: a clock the lifecycle reads, pools granted, VMs run through it.
clock = usage_fixtures.clock
pools = usage_fixtures.pools
run_vm = usage_fixtures.run_vm


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, minute, tzinfo=UTC)


@pytest.fixture
def month_of_usage(clock, pools, run_vm, tenant, other_tenant, fleet_east):
    """Twelve days of VMs of four tenants on three pools, some running at the clock (Nov 12,
    18:00)."""
    initech = Tenant.objects.create(name="Initech", slug="initech")
    umbrella = Tenant.objects.create(name="Umbrella Labs", slug="umbrella")
    all_four = [tenant, other_tenant, initech, umbrella]
    for name in ("h100-spot", "l40s-ondemand", "a100-standalone"):
        fleet.pool_set_tenants(pool=fleet_east["pools"][name], tenants=all_four)
    runs = []  # (start, end or None, tenant, pool, node, gpus)
    for day in range(1, 13):
        runs += [
            (at(day, 1), at(day, 5 + day % 6), tenant, "h100-spot", "h100-001", [0, 1, 2, 3]),
            (at(day, 2), at(day, 22), other_tenant, "l40s-ondemand", "l40s-001", [0]),
            (at(day, 6), at(day, 14 + day % 4), initech, "a100-standalone", "a100-001", [0, 1]),
        ]
        if day % 3 == 0:
            runs.append((at(day, 8), at(day, 20), umbrella, "h100-spot", "h100-002", [0]))
    runs.append((at(12, 9), None, tenant, "h100-spot", "h100-001", [4, 5, 6, 7]))
    events = sorted(
        [(start, 1, n) for n, (start, *_rest) in enumerate(runs)]
        + [(end, 0, n) for n, (_start, end, *_rest) in enumerate(runs) if end is not None]
    )
    vms = {}
    for moment, starting, n in events:
        clock.set(moment)
        _start, _end, who, pool, node, gpus = runs[n]
        if starting:
            vms[n] = run_vm(who, pool, node, gpus, name=f"{who.slug}-{pool}-{n}")
        else:
            rentals.vm_mark_stopped(vm=rentals.vm_stop(vm=vms[n]))
    clock.set(at(12, 18))


def test_operator_reads_a_months_usage_filters_a_tenant_and_exports(page, operator, month_of_usage):
    log_in(page, operator.username)
    page.goto("/usage/")
    report = page.locator("#usage-report")
    expect(report.locator("h2").first).to_contain_text("2026-10-14 to 2026-11-12")  # 30 days
    expect(report.locator("#period-default")).to_contain_text("The last 30 days")
    page.get_by_label("Month").fill("2026-11")
    page.get_by_role("button", name="Show").click()
    expect(report.locator("h2").first).to_contain_text("November 2026")
    expect(report.locator(".usage-total dd")).not_to_have_text("0.0")
    expect(report.locator("#usage-by-kind .series")).to_have_count(2)  # on-demand, spot
    expect(report.locator("#usage-by-tenant .legend-item")).to_have_count(4)
    expect(report.locator("tr.tenant-usage-row")).to_have_count(4)
    screenshot(page, "usage-overview")

    page.locator("select[name=tenant]").select_option(label="Acme AI")
    page.get_by_role("button", name="Show").click()
    expect(report.locator("h2").first).to_contain_text("Acme AI")
    expect(page).to_have_url(re.compile(r"/usage/\?month=2026-11&tenant=acme$"))
    expect(report.locator("#usage-by-tenant")).to_have_count(0)
    with page.expect_download() as download:
        report.locator("#export-csv").click()
    assert download.value.suggested_filename == "gpucap-usage-acme-2026-11.csv"
    lines = Path(download.value.path()).read_text().splitlines()
    assert len(lines) > 1 and all(",acme,Acme AI," in line for line in lines[1:])

    page.get_by_label("From").fill("2026-11-03")
    page.get_by_label("Before").fill("2026-11-08")
    page.get_by_role("button", name="Show").click()
    expect(report.locator("h2").first).to_contain_text("2026-11-03 to 2026-11-07")
    expect(report.locator("#usage-by-kind .column")).to_have_count(5)  # one per day
    screenshot(page, "usage-overview-acme-days")


def test_set_page_loads_the_gpu_allocation_chart(page, operator, month_of_usage):
    log_in(page, operator.username)
    page.goto("/fleet/sets/h100-east/")
    panel = page.locator("#set-allocation")
    expect(panel.locator("svg.chart-svg")).to_be_visible()
    expect(panel.locator(".legend-item")).to_have_count(3)  # the set's three pools
    panel.scroll_into_view_if_needed()
    panel.screenshot(path=str(screenshot(page, "usage-set-page").with_name("usage-set-chart.png")))
    panel.get_by_role("link", name="24 hours").click()
    expect(panel.locator(".column")).to_have_count(24)


def test_member_reads_their_tenants_usage_from_the_menu(page, member, month_of_usage):
    log_in(page, member.username)
    page.get_by_role("link", name="My usage").click()
    expect(page).to_have_url(re.compile(r"/tenants/acme/usage/$"))
    report = page.locator("#usage-report")
    expect(report.locator("h2").first).to_contain_text("2026-10-14 to 2026-11-12")
    expect(report.locator("#usage-by-kind .legend-item")).to_have_count(1)  # spot only
    expect(report.locator("#export-csv")).to_have_attribute(
        "href", "/tenants/acme/usage/export.csv?since=2026-10-14&until=2026-11-13"
    )
    screenshot(page, "usage-tenant")
