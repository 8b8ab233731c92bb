"""Every list endpoint bounds ``?limit=`` and ``?offset=`` and every id filter: a number out of
range or not a number is a 400 naming the parameter, never a 500 from PostgreSQL."""

import pytest

from tests.test_api_errors import assert_error

HUGE = "99999999999999999999"
LISTS = [
    "/api/clusters/",
    "/api/nodes/",
    "/api/gpus/",
    "/api/capacity-sets/",
    "/api/pools/",
    "/api/images/",
    "/api/tenants/",
    "/api/vms/",
    "/api/notices/",
    "/api/plans/",
    "/api/deployments/",
    "/api/api-keys/",
]


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        (f"limit={HUGE}", "limit"),
        (f"offset={HUGE}", "offset"),
        ("offset=-1", "offset"),
        ("limit=-5", "limit"),
        ("limit=ten", "limit"),
        ("limit=" + "9" * 5000, "limit"),
    ],
)
def test_a_pagination_parameter_out_of_range_is_a_400_naming_it(
    operator_api, fleet_east, path, query, parameter
):
    error = assert_error(operator_api.get(f"{path}?{query}"), 400, "invalid")
    assert list(error["fields"]) == [parameter]


def test_a_tenant_member_gets_the_same_400(member_api, fleet_east):
    error = assert_error(member_api.get(f"/api/vms/?limit={HUGE}"), 400, "invalid")
    assert error["fields"] == {"limit": ["must be between 1 and 1000"]}


def test_limit_and_offset_in_range_still_page(operator_api, fleet_east):
    first = operator_api.get("/api/nodes/?limit=2&offset=0").json()
    second = operator_api.get("/api/nodes/?limit=2&offset=2").json()
    assert first["count"] == 5 and len(first["results"]) == 2
    assert {n["id"] for n in first["results"]}.isdisjoint({n["id"] for n in second["results"]})
    assert operator_api.get("/api/nodes/?limit=1000").status_code == 200
    assert operator_api.get("/api/nodes/?offset=2147483647").json()["results"] == []


@pytest.mark.parametrize(
    ("path", "parameter"),
    [
        ("/api/pools/", "cluster"),
        ("/api/nodes/", "capacity_set"),
        ("/api/vms/", "pool"),
        ("/api/vms/", "node"),
        ("/api/gpus/", "node"),
        ("/api/notices/", "vm"),
        ("/api/plans/", "capacity_set"),
        ("/api/api-keys/", "deployment"),
    ],
)
@pytest.mark.parametrize("value", [HUGE, "-1", "0", "9" * 5000])
def test_an_id_filter_out_of_range_is_a_400_naming_it(
    operator_api, fleet_east, path, parameter, value
):
    error = assert_error(operator_api.get(f"{path}?{parameter}={value}"), 400, "invalid")
    assert list(error["fields"]) == [parameter]


def test_the_schema_states_the_bounds(operator_api, db):
    schema = operator_api.get("/api/schema/?format=json").json()
    parameters = {p["name"]: p["schema"] for p in schema["paths"]["/api/vms/"]["get"]["parameters"]}
    assert parameters["limit"] == {"type": "integer", "minimum": 1, "maximum": 1000}
    assert parameters["offset"]["minimum"] == 0
    assert parameters["pool"]["minimum"] == 1
