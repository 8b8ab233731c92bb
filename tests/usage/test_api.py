"""GET /api/usage/: the FOCUS rows of a period as JSON, or as CSV with ?format=csv, in the
API's one error shape when the query is wrong. Operators read everything or one tenant; a
member only their own tenants' rows."""

import csv
import io
import json
from datetime import UTC, datetime

import pytest
import yaml
from rest_framework.test import APIClient

from gpucap.rentals import services as rentals
from gpucap.tenancy.models import Membership
from gpucap.usage.export import COLUMNS

URL = "/api/usage/"
NOVEMBER = {"since": "2026-11-01", "until": "2026-12-01"}


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, minute, tzinfo=UTC)


def stop(vm):
    return rentals.vm_mark_stopped(vm=rentals.vm_stop(vm=vm))


def body(response) -> str:
    return b"".join(response.streaming_content).decode()


def records(response) -> list[dict]:
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    return json.loads(body(response))["records"]


@pytest.fixture
def usage(clock, pools, run_vm, tenant, other_tenant):
    clock.set(at(1, 10))
    mine = run_vm(tenant, "h100-spot", "h100-001", [0, 1], name="mine")
    theirs = run_vm(other_tenant, "l40s-ondemand", "l40s-001", [0], name="theirs")
    clock.set(at(1, 12, 30))
    stop(mine)
    stop(theirs)
    clock.set(at(2, 9))


def test_operators_read_every_tenants_rows(operator_api, usage):
    rows = records(operator_api.get(URL, NOVEMBER))

    assert {row["SubAccountId"] for row in rows} == {"acme", "globex"}
    assert len(rows) == 3 + 3  # 10:00-12:30 in three hourly pieces each
    assert list(rows[0]) == COLUMNS
    assert sum(float(r["ConsumedQuantity"]) for r in rows if r["SubAccountId"] == "acme") == (
        2 * 2.5 * 3600
    )


def test_operators_read_one_tenants_rows(operator_api, usage):
    rows = records(operator_api.get(URL, NOVEMBER | {"tenant": "globex"}))

    assert {row["ResourceName"] for row in rows} == {"theirs"}


def test_csv_carries_the_same_rows_as_json(operator_api, usage):
    as_json = records(operator_api.get(URL, NOVEMBER))
    response = operator_api.get(URL, NOVEMBER | {"format": "csv"})

    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    as_csv = list(csv.DictReader(io.StringIO(body(response))))
    assert [row["x_RecordId"] for row in as_csv] == [row["x_RecordId"] for row in as_json]
    assert [row["ConsumedQuantity"] for row in as_csv] == [
        row["ConsumedQuantity"] for row in as_json
    ]


def test_members_read_only_their_tenants_rows(member_api, usage):
    rows = records(member_api.get(URL, NOVEMBER))
    assert {row["SubAccountId"] for row in rows} == {"acme"}
    rows = records(member_api.get(URL, NOVEMBER | {"tenant": "acme", "format": "json"}))
    assert {row["ResourceName"] for row in rows} == {"mine"}


def test_a_member_asking_for_another_tenant_gets_404_like_a_tenant_that_does_not_exist(
    member_api, usage
):
    for slug in ("globex", "nobody"):
        response = member_api.get(URL, NOVEMBER | {"tenant": slug})
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


def test_a_member_of_two_tenants_reads_both(member, member_api, other_tenant, usage):
    Membership.objects.create(user=member, tenant=other_tenant, role=Membership.Role.MEMBER)

    response = member_api.get(URL, NOVEMBER)

    assert json.loads(body(response))["meta"]["tenants"] == ["acme", "globex"]
    assert len(json.loads(body(member_api.get(URL, NOVEMBER)))["records"]) == 6


def test_a_user_of_no_tenant_reads_nothing(django_user_model, usage):
    client = APIClient()
    client.force_authenticate(django_user_model.objects.create_user("nobody", "n@x.example"))

    assert records(client.get(URL, NOVEMBER)) == []


def test_anonymous_requests_are_401(anonymous_api, usage):
    assert anonymous_api.get(URL, NOVEMBER).status_code == 401


@pytest.mark.parametrize(
    ("query", "field", "reason"),
    [
        ({"since": "2026-11-31", "until": "2026-12-01"}, "since", "Date has wrong format"),
        ({"since": "2026-11-01", "until": "12/01/2026"}, "until", "Date has wrong format"),
        ({"until": "2026-12-01"}, "since", "required"),
        ({"since": "2026-11-01"}, "until", "required"),
        ({"since": "2026-11-01", "until": "2026-11-01"}, "until", "later day than since"),
        ({"since": "2026-11-01", "until": "2026-10-01"}, "until", "later day than since"),
        ({"since": "2026-01-01", "until": "2027-01-03"}, "until", "at most 366 days"),
        ({**NOVEMBER, "tenant": "nobody"}, "tenant", "no tenant 'nobody'"),
    ],
)
def test_a_bad_query_is_400_naming_the_field(operator_api, usage, query, field, reason):
    for fmt in ("json", "csv"):
        response = operator_api.get(URL, query | {"format": fmt})
        assert response.status_code == 400
        assert response["Content-Type"] == "application/json"  # errors keep the one shape
        error = response.json()["error"]
        assert error["code"] == "invalid"
        assert reason in error["fields"][field][0], error


def test_a_leap_years_366_days_are_one_period(operator_api, usage):
    response = operator_api.get(URL, {"since": "2028-01-01", "until": "2029-01-01"})

    assert records(response) == []


def test_the_endpoint_is_in_the_openapi_schema_with_both_formats(anonymous_api, db):
    schema = yaml.safe_load(anonymous_api.get("/api/schema/").content)
    operation = schema["paths"]["/api/usage/"]["get"]

    assert {p["name"] for p in operation["parameters"]} == {
        "since",
        "until",
        "tenant",
        "allocation",
        "format",
    }
    assert set(operation["responses"]["200"]["content"]) == {"application/json", "text/csv"}
    assert operation["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ApiError"
    }
    record = schema["components"]["schemas"]["UsageRecord"]
    assert list(record["properties"]) == COLUMNS


def test_the_query_count_does_not_grow_with_the_rows(
    member, operator_api, usage, clock, run_vm, tenant, django_assert_num_queries
):
    def as_member() -> APIClient:  # a fresh user each time, as each real request has
        client = APIClient()
        client.force_authenticate(type(member).objects.get(pk=member.pk))
        return client

    # member: memberships, their tenants, the rows; operator: operator group, the rows.
    client = as_member()
    with django_assert_num_queries(3):
        first = len(records(client.get(URL, NOVEMBER)))
    with django_assert_num_queries(2):
        assert len(records(operator_api.get(URL, NOVEMBER))) == 6
    for n in range(4):
        vm = run_vm(tenant, "h100-spot", "h100-002", [n], name=f"more-{n}")
        clock.advance(minutes=7)
        stop(vm)
    client = as_member()
    with django_assert_num_queries(3):
        assert len(records(client.get(URL, NOVEMBER))) > first
