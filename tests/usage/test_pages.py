"""The usage pages: an operator's view of every tenant's GPU time in a period, a tenant's own
usage, and the set page's GPU allocation chart. Tenants see only their own; operators all;
the query count does not grow with the data."""

import re
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.urls import reverse

from gpucap.rentals import services as rentals
from gpucap.tenancy.models import Membership

HTMX = {"HX-Request": "true"}
OVERVIEW = reverse("usage:overview")
NOVEMBER = {"since": "2026-11-01", "until": "2026-12-01"}


def at(day: int, hour: int, minute: int = 0, month: int = 11) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


def stop(vm):
    return rentals.vm_mark_stopped(vm=rentals.vm_stop(vm=vm))


def tenant_usage_url(slug: str = "acme") -> str:
    return reverse("usage:tenant-usage", kwargs={"slug": slug})


@pytest.fixture
def usage(clock, pools, run_vm, tenant, other_tenant):
    """acme: 2 spot GPUs for 3 h on Nov 1 and 1 for 1.5 h on Nov 2; globex: 1 on-demand GPU
    for 2 h on Nov 2, still running at the clock (Nov 2 12:00)."""
    clock.set(at(1, 9))
    a = run_vm(tenant, "h100-spot", "h100-001", [0, 1], name="trainer")
    clock.set(at(1, 12))
    stop(a)
    clock.set(at(2, 8))
    b = run_vm(tenant, "h100-spot", "h100-001", [2], name="notebook")
    clock.set(at(2, 9, 30))
    stop(b)
    clock.set(at(2, 10))
    run_vm(other_tenant, "l40s-ondemand", "l40s-001", [0], name="render")
    clock.set(at(2, 12))


def more_usage(run_vm, tenant, other_tenant, clock, n: int) -> None:
    """``n`` more short VMs of each tenant on Nov 2 (the data grows, the queries must not)."""
    clock.set(at(2, 12, 5))
    for i in range(n):
        vm = run_vm(tenant, "l40s-ondemand", "l40s-002", [i % 4], name=f"more-{i}")
        clock.advance(minutes=1)
        stop(vm)
        vm = run_vm(other_tenant, "l40s-ondemand", "l40s-002", [i % 4], name=f"theirs-{i}")
        clock.advance(minutes=1)
        stop(vm)


def test_operator_page_totals_gpu_hours_by_pool_kind_and_by_tenant(operator_client, usage):
    response = operator_client.get(OVERVIEW, NOVEMBER)

    assert response.status_code == 200
    summary = response.context["summary"]
    assert summary.gpu_hours == 3 * 2 + 1.5 + 2  # acme 7.5 spot, globex 2 on-demand
    assert summary.by_kind == {
        "on_demand": 2,
        "spot": Decimal("7.5"),
        "inference": 0,
        "bare_metal": 0,
    }
    assert [(t.slug, t.gpu_hours) for t in summary.tenants] == [("acme", 7.5), ("globex", 2)]
    page = response.content.decode()
    assert "November 2026 · all tenants" in page
    assert "<dd>9.5</dd>" in page
    assert 'id="usage-by-kind"' in page and 'id="usage-by-tenant"' in page
    assert 'href="/usage/export.csv?since=2026-11-01&amp;until=2026-12-01"' in page
    assert 'href="/usage/export.json?since=2026-11-01&amp;until=2026-12-01"' in page


def test_operator_page_defaults_to_the_last_30_days_and_says_so(operator_client, usage):
    response = operator_client.get(OVERVIEW)

    period = response.context["period"]
    assert (period.since, period.until) == (date(2026, 10, 4), date(2026, 11, 3))
    form = response.context["form"]
    assert (form["since"].value(), form["until"].value()) == ("2026-10-04", "2026-11-03")
    page = response.content.decode()
    assert "The last 30 days, today included (UTC). For an invoice's period, pick a month" in page
    assert response.context["summary"].gpu_hours == Decimal("9.5")


def test_on_the_1st_the_default_period_keeps_the_weeks_before_it(
    operator_client, clock, pools, run_vm, tenant
):
    """On the 1st a calendar month would be one bar; the default shows the month that just
    ended too, and this month is one click away."""
    clock.set(at(17, 9))
    vm = run_vm(tenant, "h100-spot", "h100-001", [0], name="fortnight")
    clock.set(at(1, 6, month=12))  # two weeks on, the 1st of December, 06:00 UTC
    stop(vm)

    response = operator_client.get(OVERVIEW)

    period = response.context["period"]
    assert (period.since, period.until) == (date(2026, 11, 2), date(2026, 12, 2))
    summary = response.context["summary"]
    assert summary.days[0] == date(2026, 11, 2) and summary.days[-1] == date(2026, 12, 1)
    assert summary.gpu_hours == 15 + 13 * 24 + 6  # Nov 17 09:00 to Dec 1 06:00, one GPU
    assert "The last 30 days, today included" in response.content.decode()

    december = operator_client.get(OVERVIEW, {"month": "2026-12"}).context["summary"]
    assert december.gpu_hours == 6


def test_operator_page_of_one_tenant_shows_only_its_usage_and_exports(operator_client, usage):
    response = operator_client.get(OVERVIEW, {"month": "2026-11", "tenant": "globex"})

    summary = response.context["summary"]
    assert [t.slug for t in summary.tenants] == ["globex"]
    assert summary.gpu_hours == 2
    page = response.content.decode()
    assert "/usage/export.csv?since=2026-11-01&amp;until=2026-12-01&amp;tenant=globex" in page
    assert 'id="usage-by-tenant"' not in page


def test_a_range_of_days_counts_only_those_days(operator_client, usage):
    response = operator_client.get(OVERVIEW, {"since": "2026-11-02", "until": "2026-11-03"})

    assert response.context["period"].label == "2026-11-02"
    assert response.context["summary"].gpu_hours == Decimal("3.5")  # 1.5 acme + 2 globex
    assert response.context["summary"].days == [date(2026, 11, 2)]


@pytest.mark.parametrize(
    ("query", "field", "reason"),
    [
        ({"since": "2026-11-05", "until": "2026-11-05"}, "until", "later day than since"),
        ({"since": "2026-01-01", "until": "2027-01-03"}, "until", "at most 366 days"),
        ({"since": "2026-13-01", "until": "2026-12-01"}, "since", "YYYY-MM-DD"),
        ({"since": "2026-11-01"}, "until", "first day not counted"),
        ({"month": "November"}, "month", "YYYY-MM"),
        ({"month": "2026-11", "tenant": "nobody"}, "tenant", "No tenant nobody"),
    ],
)
def test_a_bad_period_is_400_naming_the_field_beside_it_and_shows_the_default(
    operator_client, usage, query, field, reason
):
    response = operator_client.get(OVERVIEW, query)

    assert response.status_code == 400
    assert reason in response.context["form"].errors[field][0]
    page = response.content.decode()
    assert f"{field}: " in page and "This is 2026-10-04 to 2026-11-02 instead" in page
    assert re.search(rf'<span class="field-error" id="id_{field}-error">[^<]*{reason}', page)
    assert response.context["period"].label == "2026-10-04 to 2026-11-02"


def test_htmx_request_answers_only_the_report(operator_client, usage):
    response = operator_client.get(OVERVIEW, NOVEMBER, headers=HTMX)

    page = response.content.decode()
    assert page.lstrip().startswith('<div id="usage-report">')
    assert "<html" not in page and 'class="topbar"' not in page
    assert response["Vary"].count("HX-Request") == 1


def test_operator_page_is_for_operators(member_client, client, usage):
    assert member_client.get(OVERVIEW).status_code == 403
    assert client.get(OVERVIEW).status_code == 302  # to the login page


def test_operator_page_query_count_does_not_grow_with_usage(
    operator_client, usage, run_vm, tenant, other_tenant, clock, django_assert_num_queries
):
    # session, user, operator group; tenants; the usage summed per day, tenant and kind.
    with django_assert_num_queries(5):
        operator_client.get(OVERVIEW, NOVEMBER)
    more_usage(run_vm, tenant, other_tenant, clock, 6)
    with django_assert_num_queries(5):
        response = operator_client.get(OVERVIEW, NOVEMBER)
    assert len(response.context["summary"].tenants) == 2


def test_tenant_page_shows_the_members_own_usage(member_client, usage):
    response = member_client.get(tenant_usage_url(), NOVEMBER)

    assert response.status_code == 200
    summary = response.context["summary"]
    assert [t.slug for t in summary.tenants] == ["acme"]
    assert summary.by_kind["spot"] == Decimal("7.5") and summary.by_kind["on_demand"] == 0
    page = response.content.decode()
    assert "/tenants/acme/usage/export.csv?since=2026-11-01&amp;until=2026-12-01" in page
    assert "render" not in page and "Globex" not in page
    assert "Operator view" not in page


def test_tenant_page_of_another_tenant_is_404(other_member_client, usage):
    assert other_member_client.get(tenant_usage_url("acme")).status_code == 404
    assert other_member_client.get(tenant_usage_url("nobody")).status_code == 404


def test_operators_see_any_tenants_page_read_only(operator_client, usage):
    response = operator_client.get(tenant_usage_url("globex"), NOVEMBER)

    assert response.status_code == 200
    assert response.context["summary"].gpu_hours == 2
    assert "Operator view · read-only" in response.content.decode()


def test_tenant_page_htmx_request_answers_only_the_report(member_client, usage):
    response = member_client.get(tenant_usage_url(), {"month": "2026-11"}, headers=HTMX)

    page = response.content.decode()
    assert page.lstrip().startswith('<div id="usage-report">') and "<html" not in page


def test_tenant_page_query_count_does_not_grow_with_usage(
    member_client, usage, run_vm, tenant, other_tenant, clock, django_assert_num_queries
):
    # session, user, memberships; tenant; the usage summed.
    with django_assert_num_queries(5):
        member_client.get(tenant_usage_url(), NOVEMBER)
    more_usage(run_vm, tenant, other_tenant, clock, 6)
    with django_assert_num_queries(5):
        member_client.get(tenant_usage_url(), NOVEMBER)


def test_my_usage_takes_a_member_to_their_tenant_and_an_operator_to_all(
    member_client, operator_client, usage
):
    assert member_client.get(reverse("usage:mine")).url == tenant_usage_url("acme")
    assert operator_client.get(reverse("usage:mine")).url == OVERVIEW


def test_my_usage_lets_a_member_of_two_tenants_pick(member, member_client, other_tenant):
    Membership.objects.create(user=member, tenant=other_tenant, role=Membership.Role.MEMBER)

    response = member_client.get(reverse("usage:mine"))

    page = response.content.decode()
    assert tenant_usage_url("acme") in page and tenant_usage_url("globex") in page


def test_nav_links_usage_for_operators_and_my_usage_for_members(
    operator_client, member_client, usage
):
    assert (
        'href="/usage/" aria-current="page">Usage</a>'
        in operator_client.get(OVERVIEW).content.decode()
    )
    page = member_client.get(tenant_usage_url()).content.decode()
    assert 'href="/usage/mine/" aria-current="page">My usage</a>' in page


# --- the set page's GPU allocation chart ------------------------------------------------------


def allocation_url(days: str | None = None) -> str:
    url = reverse("usage:set-allocation", kwargs={"name": "h100-east"})
    return f"{url}?days={days}" if days else url


def test_set_page_loads_the_allocation_chart(operator_client, fleet_east):
    page = operator_client.get(reverse("fleet:capacity-set-detail", args=["h100-east"]))

    assert f'hx-get="{allocation_url()}" hx-trigger="load"' in page.content.decode()


def test_the_chart_tells_the_set_pages_poll_which_span_is_shown(operator_client, fleet_east):
    chart = operator_client.get(allocation_url("30"), headers=HTMX).content.decode()
    assert '<input type="hidden" id="chart-days" name="days" value="30">' in chart


def test_allocation_chart_shows_gpus_held_per_pool_of_the_set_only(operator_client, usage):
    response = operator_client.get(allocation_url("1"), headers=HTMX)

    chart = response.context["chart"]
    assert chart.chart_id == "gpus-held"
    page = response.content.decode()
    assert page.count('class="legend-item"') == 3  # h100-inference, h100-ondemand, h100-spot
    assert 'data-series="h100-spot"' in page and "l40s" not in page
    assert 'aria-current="true">24 hours</a>' in page


def test_allocation_chart_is_for_operators(member_client, fleet_east):
    assert member_client.get(allocation_url()).status_code == 403


def test_allocation_chart_query_count_does_not_grow_with_usage(
    operator_client, usage, run_vm, tenant, other_tenant, clock, django_assert_num_queries
):
    # session, user, operator group; set; its pools; GPUs held per step and pool.
    with django_assert_num_queries(6):
        operator_client.get(allocation_url(), headers=HTMX)
    more_usage(run_vm, tenant, other_tenant, clock, 6)
    with django_assert_num_queries(6):
        operator_client.get(allocation_url("30"), headers=HTMX)
