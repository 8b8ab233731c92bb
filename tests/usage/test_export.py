"""Usage exports from the pages: CSV and JSON carry the same rows, exact to the lifecycle's
intervals, streamed as downloads named for the tenant and period; each tenant's exports hold
only its rows whatever the query says."""

import csv
import io
import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.http import StreamingHttpResponse
from django.urls import reverse

from gpucap.rentals import services as rentals
from gpucap.usage.export import COLUMNS
from gpucap.usage.models import UsageInterval

NOVEMBER = {"since": "2026-11-01", "until": "2026-12-01"}


def at(day: int, hour: int, minute: int = 0, second: int = 0, micro: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, minute, second, micro, tzinfo=UTC)


def stop(vm):
    return rentals.vm_mark_stopped(vm=rentals.vm_stop(vm=vm))


def export_url(fmt: str, slug: str | None = None) -> str:
    if slug is None:
        return reverse("usage:export", kwargs={"fmt": fmt})
    return reverse("usage:tenant-usage-export", kwargs={"slug": slug, "fmt": fmt})


def body(response) -> str:
    assert isinstance(response, StreamingHttpResponse)
    return b"".join(response.streaming_content).decode()


def csv_rows(response) -> list[dict]:
    return list(csv.DictReader(io.StringIO(body(response))))


def json_rows(response) -> list[dict]:
    return json.loads(body(response))["records"]


@pytest.fixture
def usage(clock, pools, run_vm, tenant, other_tenant):
    """acme: a 2-GPU spot VM from Nov 1 22:47:13.25 across midnight to Nov 2 01:05:09.5, and a
    1-GPU one still running at the clock; globex: an on-demand VM on Nov 2."""
    clock.set(at(1, 22, 47, 13, 250_000))
    trainer = run_vm(tenant, "h100-spot", "h100-001", [0, 1], name="trainer")
    clock.set(at(2, 1, 5, 9, 500_000))
    stop(trainer)
    clock.set(at(2, 3, 10))
    run_vm(tenant, "h100-spot", "h100-001", [2], name="still-running")
    clock.set(at(2, 4))
    theirs = run_vm(other_tenant, "l40s-ondemand", "l40s-001", [0], name="render")
    clock.set(at(2, 6, 30))
    stop(theirs)
    clock.set(at(2, 7, 45, 30))


def test_csv_and_json_carry_the_same_rows(operator_client, usage):
    as_csv = csv_rows(operator_client.get(export_url("csv"), NOVEMBER))
    as_json = json_rows(operator_client.get(export_url("json"), NOVEMBER))

    assert len(as_csv) == len(as_json) == 4 + 5 + 3  # trainer, still-running, render pieces
    for from_csv, from_json in zip(as_csv, as_json, strict=True):
        assert list(from_csv) == list(from_json) == COLUMNS
        typed = from_csv | {
            "x_GpuCount": int(from_csv["x_GpuCount"]),
            "x_Final": from_csv["x_Final"] == "true",
        }
        assert typed == from_json


def test_export_gpu_seconds_equal_the_lifecycles_intervals_to_the_second(operator_client, usage):
    rows = csv_rows(operator_client.get(export_url("csv"), NOVEMBER))

    by_vm: dict[str, Decimal] = {}
    for row in rows:
        by_vm[row["ResourceName"]] = by_vm.get(row["ResourceName"], 0) + Decimal(
            row["ConsumedQuantity"]
        )
    now = at(2, 7, 45, 30)
    for interval in UsageInterval.objects.select_related("vm"):
        held = ((interval.ended_at or now) - interval.started_at).total_seconds()
        assert by_vm[interval.vm.name] == Decimal(str(held)) * interval.gpu_count
    assert by_vm["trainer"] == Decimal("16552.500")  # 2 GPUs x 2 h 17 min 56.25 s
    # Cut at midnight and at each hour; the pieces of a running VM are not final yet.
    trainer = [row for row in rows if row["ResourceName"] == "trainer"]
    assert [row["ChargePeriodStart"] for row in trainer][:2] == [
        "2026-11-01T22:47:13.250000Z",
        "2026-11-01T23:00:00Z",
    ]
    assert trainer[2]["ChargePeriodStart"] == "2026-11-02T00:00:00Z"
    assert [row["x_Final"] for row in rows if row["ResourceName"] == "still-running"][-1] == (
        "false"
    )


def test_exports_are_downloads_named_for_tenant_and_period(operator_client, member_client, usage):
    response = operator_client.get(export_url("csv"), NOVEMBER)
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="gpucap-usage-all-2026-11.csv"'

    response = operator_client.get(export_url("json"), NOVEMBER | {"tenant": "globex"})
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == (
        'attachment; filename="gpucap-usage-globex-2026-11.json"'
    )
    assert json.loads(body(response))["meta"] == {
        **NOVEMBER,
        "tenants": ["globex"],
        "generated_at": "2026-11-02T07:45:30Z",
        "usage_period_seconds": 3600,
        "columns": COLUMNS,
    }

    response = member_client.get(
        export_url("csv", "acme"), {"since": "2026-11-02", "until": "2026-11-09"}
    )
    assert response["Content-Disposition"] == (
        'attachment; filename="gpucap-usage-acme-2026-11-02_2026-11-09.csv"'
    )


def test_operator_export_of_one_tenant_holds_only_its_rows(operator_client, usage):
    rows = csv_rows(operator_client.get(export_url("csv"), NOVEMBER | {"tenant": "globex"}))

    assert {row["SubAccountId"] for row in rows} == {"globex"}
    assert {row["ResourceName"] for row in rows} == {"render"}


def test_tenant_export_holds_only_its_rows_whatever_the_query_says(member_client, usage):
    for fmt, read in (("csv", csv_rows), ("json", json_rows)):
        response = member_client.get(export_url(fmt, "acme"), NOVEMBER | {"tenant": "globex"})
        rows = read(response)
        assert {row["SubAccountId"] for row in rows} == {"acme"}
        assert {row["ResourceName"] for row in rows} == {"trainer", "still-running"}


def test_another_tenants_exports_are_404(other_member_client, usage):
    for fmt in ("csv", "json"):
        assert other_member_client.get(export_url(fmt, "acme"), NOVEMBER).status_code == 404


def test_the_operators_export_is_for_operators(member_client, usage):
    assert member_client.get(export_url("csv"), NOVEMBER).status_code == 403
    assert member_client.get(export_url("json"), NOVEMBER).status_code == 403


def test_operators_may_export_any_tenants_rows_from_its_page(operator_client, usage):
    rows = csv_rows(operator_client.get(export_url("csv", "globex"), NOVEMBER))

    assert {row["SubAccountId"] for row in rows} == {"globex"}


def test_a_bad_period_is_400_naming_the_field(operator_client, member_client, usage):
    response = operator_client.get(
        export_url("csv"), {"since": "2026-11-05", "until": "2026-11-01"}
    )
    assert response.status_code == 400
    assert response.content.decode() == "until: must be a later day than since"

    response = member_client.get(
        export_url("json", "acme"), {"since": "yesterday", "until": "2026-11-01"}
    )
    assert response.status_code == 400
    assert response.content.decode().startswith("since: Enter a day as YYYY-MM-DD.")


def test_an_export_with_no_period_is_this_month(member_client, usage):
    response = member_client.get(export_url("json", "acme"))

    meta = json.loads(body(response))["meta"]
    assert (meta["since"], meta["until"]) == ("2026-11-01", "2026-12-01")


def test_the_export_streams_in_a_fixed_number_of_queries(
    member_client, usage, run_vm, tenant, clock, django_assert_num_queries
):
    # session, user, memberships; tenant; the rows (one server-side cursor).
    with django_assert_num_queries(5):
        first = len(csv_rows(member_client.get(export_url("csv", "acme"), NOVEMBER)))
    for n in range(4):
        vm = run_vm(tenant, "h100-spot", "h100-002", [n], name=f"more-{n}")
        clock.advance(minutes=5)
        stop(vm)
    with django_assert_num_queries(5):
        assert len(csv_rows(member_client.get(export_url("csv", "acme"), NOVEMBER))) > first
