"""Every API error has one body: {"error": {"code", "message", "fields"}}, whatever raised it:
a serializer, a service, authentication, permissions, a missing object or route, a method."""

import logging

import pytest
from django.test import Client

from gpucap.fleet import services as fleet
from gpucap.fleet.api import ClusterViewSet
from gpucap.fleet.models import Node
from gpucap.web.errors import FriendlyErrorPages


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert list(body) == ["error"]
    assert set(body["error"]) == {"code", "message", "fields"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return body["error"]


def test_serializer_validation_names_every_missing_field(operator_api, db):
    error = assert_error(operator_api.post("/api/nodes/", {}, format="json"), 400, "invalid")
    assert set(error["fields"]) == {"cluster", "hostname", "gpu_model", "fabric", "gpu_count"}
    assert error["fields"]["hostname"] == ["This field is required."]
    assert "hostname: This field is required." in error["message"]


def test_service_validation_names_the_field_and_the_reason(operator_api, fleet_east):
    body = {
        "cluster": fleet_east["cluster"].pk,
        "name": "h100-batch",
        "kind": "spot",
        "capacity_set": fleet_east["sets"]["h100-east"].pk,
        "rank": 1,
    }
    error = assert_error(operator_api.post("/api/pools/", body, format="json"), 400, "invalid")
    assert error["fields"] == {
        "rank": ["rank 1 is already used by another pool in capacity set h100-east"]
    }
    assert (
        error["message"] == "rank: rank 1 is already used by another pool in capacity set h100-east"
    )


def test_a_field_the_request_cannot_set_is_refused_by_name(operator_api, fleet_east):
    node = fleet_east["nodes"]["a100-001"]
    response = operator_api.patch(f"/api/nodes/{node.pk}/", {"hostnme": "typo"}, format="json")
    error = assert_error(response, 400, "invalid")
    assert error["fields"] == {"hostnme": ["cannot be set by this request"]}


def test_malformed_json_is_a_400(operator_api, db):
    response = operator_api.generic(
        "POST", "/api/clusters/", "{not json", content_type="application/json"
    )
    error = assert_error(response, 400, "parse_error")
    assert "JSON parse error" in error["message"]


def test_a_conflict_is_a_409(operator_api, fleet_east):
    node = fleet.node_set_state(node=fleet_east["nodes"]["a100-001"], state="down")
    error = assert_error(operator_api.post(f"/api/nodes/{node.pk}/uncordon/"), 409, "conflict")
    assert error == {
        "code": "conflict",
        "message": "node a100-001 is down; it cannot become ready",
        "fields": {},
    }


def test_a_refused_delete_is_a_409_not_a_500(operator_api, fleet_east):
    response = operator_api.delete(f"/api/capacity-sets/{fleet_east['sets']['h100-east'].pk}/")
    error = assert_error(response, 409, "in_use")
    assert "2 nodes (h100-001, h100-002)" in error["message"]


def test_not_authenticated_is_a_401_that_says_how_to_authenticate(anonymous_api, db):
    response = anonymous_api.get("/api/nodes/")
    error = assert_error(response, 401, "not_authenticated")
    assert error["message"] == "Authentication credentials were not provided."
    assert response["WWW-Authenticate"] == "Token"


def test_permission_denied_is_a_403(member_api, db):
    error = assert_error(member_api.get("/api/clusters/"), 403, "permission_denied")
    assert error["message"] == "Only operators may do this."


def test_a_missing_object_is_a_404(operator_api, db):
    assert_error(operator_api.get("/api/nodes/987654/"), 404, "not_found")


@pytest.mark.parametrize("path", ["/api/nope/", "/api/nodes/1/reboot/"])
def test_an_unknown_api_path_is_a_json_404(operator_api, db, path):
    error = assert_error(operator_api.get(path), 404, "not_found")
    assert error["message"] == f"no API endpoint at {path}"


def test_a_path_missing_its_trailing_slash_says_so(operator_api, db):
    error = assert_error(operator_api.post("/api/nodes", {}), 404, "not_found")
    assert error["message"] == (
        "no API endpoint at /api/nodes; did you mean /api/nodes/ (with the trailing slash)?"
    )


def test_a_method_the_endpoint_does_not_allow_is_a_405(operator_api, fleet_east):
    node = fleet_east["nodes"]["a100-001"]
    error = assert_error(
        operator_api.put(f"/api/nodes/{node.pk}/", {"labels": {}}, format="json"),
        405,
        "method_not_allowed",
    )
    assert error["message"] == 'Method "PUT" not allowed.'
    assert_error(operator_api.get(f"/api/nodes/{node.pk}/cordon/"), 405, "method_not_allowed")
    assert Node.objects.get(pk=node.pk).state == "ready"


# --- what nobody handled: JSON with a request id, never Django's HTML 500 ---------------------


def _request_id_logged(caplog, request_id: str) -> logging.LogRecord:
    records = [r for r in caplog.records if request_id in r.getMessage()]
    assert records, "the request id is not in the log"
    assert records[0].exc_info is not None, "the traceback is not logged with it"
    return records[0]


@pytest.mark.parametrize("debug", [False, True])
def test_an_unhandled_error_in_a_view_is_a_json_500_with_a_request_id(
    settings, operator, monkeypatch, caplog, debug
):
    settings.DEBUG = debug

    def broken(self):
        raise RuntimeError("the disk is on fire")

    monkeypatch.setattr(ClusterViewSet, "get_queryset", broken)
    client = Client(raise_request_exception=False)
    client.force_login(operator)

    response = client.get("/api/clusters/")

    error = assert_error(response, 500, "server_error")
    request_id = response["X-Request-Id"]
    assert request_id in error["message"]
    assert "disk is on fire" not in response.content.decode()
    record = _request_id_logged(caplog, request_id)
    assert "the disk is on fire" in str(record.exc_info[1])


def test_an_error_in_a_middleware_under_api_is_a_json_500(settings, operator, monkeypatch, caplog):
    settings.DEBUG = False

    def broken(self, request):
        raise RuntimeError("the middleware is on fire")

    monkeypatch.setattr(FriendlyErrorPages, "__call__", broken)
    client = Client(raise_request_exception=False)
    client.force_login(operator)

    response = client.get("/api/clusters/")
    page = client.get("/tenants/")

    error = assert_error(response, 500, "server_error")
    _request_id_logged(caplog, response["X-Request-Id"])
    assert error["message"].count(response["X-Request-Id"]) == 1
    assert page.status_code == 500 and page["Content-Type"].startswith("text/html")


def test_a_form_body_over_the_upload_limit_is_a_json_413(settings, operator_api, db):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = operator_api.post("/api/clusters/", {"name": "x" * 5000, "driver": "simulated"})
    error = assert_error(response, 413, "too_large")
    assert "over 1000 bytes" in error["message"]


# --- what schemathesis found (tests/test_api_fuzz.py) -------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "/api/api-keys/?revoked=null",
        "/api/api-keys/?all_deployments=yes",
        "/api/nodes/?standalone=1",
        "/api/pools/?standalone=",
        "/api/images/?enabled=null",
        "/api/notices/?open=True",
    ],
)
def test_a_yes_no_filter_takes_true_or_false_and_nothing_else(operator_api, fleet_east, query):
    """Read as "unknown", these dropped the filter: every row came back, as if filtered."""
    name = query.split("?")[1].split("=")[0]
    error = assert_error(operator_api.get(query), 400, "invalid")
    assert set(error["fields"]) == {name}
    assert "is not true or false" in error["fields"][name][0]


@pytest.mark.parametrize(
    "query",
    [
        "/api/images/?cluster=266054358511241&enabled=%25O",
        "/api/images/?enabled=100%25",
        "/api/nodes/?state=%25s&standalone=%25d",
        "/api/notices/?open=%25(value)s",
    ],
)
def test_a_filter_value_holding_a_percent_sign_is_a_400_not_a_500(operator_api, fleet_east, query):
    """schemathesis found ``enabled=%O`` a 500: the value was written into the message that
    django-filter then formatted with ``%``."""
    error = assert_error(operator_api.get(query), 400, "invalid")
    bad = [part.split("=")[0] for part in query.split("?")[1].split("&") if "%25" in part]
    assert set(bad) <= set(error["fields"])
    for name in bad:
        assert "%" in error["fields"][name][0]


@pytest.mark.parametrize(
    "query",
    ["/api/deployments/?pool=", "/api/images/?cluster=", "/api/vms/?pool=&state=running"],
)
def test_an_id_filter_given_empty_is_refused_not_dropped(operator_api, fleet_east, query):
    """``?pool=`` was read as no filter: every row came back, as if filtered (the API fuzz)."""
    name = query.split("?")[1].split("=")[0]
    error = assert_error(operator_api.get(query), 400, "invalid")
    assert set(error["fields"]) == {name}
    assert "leave the parameter out not to filter" in error["fields"][name][0]


@pytest.mark.parametrize(
    "query",
    ["/api/nodes/?state=", "/api/vms/?state=", "/api/pools/?kind=", "/api/notices/?reason="],
)
def test_a_choice_filter_given_empty_is_refused_not_dropped(operator_api, fleet_east, query):
    """``?state=`` was read as no filter: every row came back, as if filtered."""
    name = query.split("?")[1].split("=")[0]
    error = assert_error(operator_api.get(query), 400, "invalid")
    assert set(error["fields"]) == {name}
    assert "leave the parameter out not to filter" in error["fields"][name][0]


def test_a_choice_filter_still_filters(operator_api, fleet_east):
    response = operator_api.get("/api/nodes/?state=ready&fabric=pcie")
    assert sorted(node["hostname"] for node in response.json()["results"]) == [
        "l40s-001",
        "l40s-002",
    ]


def test_a_yes_no_filter_still_filters(operator_api, fleet_east):
    response = operator_api.get("/api/nodes/?standalone=true")
    assert [node["hostname"] for node in response.json()["results"]] == ["a100-001"]


def test_a_json_value_of_the_wrong_type_is_refused_not_converted(operator_api, db):
    """DRF took ``"name": 0`` as the name "0": a client's mistake passed as something else."""
    body = {"name": 0, "driver": "simulated"}
    error = assert_error(operator_api.post("/api/clusters/", body, format="json"), 400, "invalid")
    assert error["fields"] == {"name": ["must be text, not 0"]}


def test_a_number_sent_as_text_is_refused_in_json(member_api, fleet_east):
    pool = fleet_east["pools"]["h100-spot"]
    body = {"tenant": "acme", "pool": pool.pk, "name": "x", "gpu_count": "1"}
    error = assert_error(member_api.post("/api/vms/", body, format="json"), 400, "invalid")
    assert error["fields"]["gpu_count"] == ['must be a whole number, not "1"']


def test_the_token_endpoint_refuses_a_control_character_naming_the_field(anonymous_api, db):
    """It read its body with DRF's own parsers, which skip gpucap's text checks."""
    body = {"username": "olivia\x00", "password": "x"}
    error = assert_error(anonymous_api.post("/api/token/", body, format="json"), 400, "invalid")
    assert set(error["fields"]) == {"username"}


def test_an_invitation_with_a_field_it_does_not_take_is_refused_by_name(member_api, tenant):
    body = {"email": "nina@acme.example", "role": "member", "admin": True}
    response = member_api.post(f"/api/tenants/{tenant.pk}/invitations/", body, format="json")
    error = assert_error(response, 400, "invalid")
    assert error["fields"] == {"admin": ["cannot be set by this request"]}


@pytest.mark.parametrize("floor", [562_271_894_506_018, -(2**40)])
@pytest.mark.parametrize("pool_name", ["h100-spot", "a100-standalone"])
def test_a_whole_number_beyond_the_databases_integer_is_a_400_naming_the_field(
    operator_api, fleet_east, pool_name, floor
):
    """schemathesis sent a floor of 562271894506018: PostgreSQL refused it ("integer out of
    range") and the API answered 500. Every integer of a request is bounded, and the schema
    says so."""
    pool = fleet_east["pools"][pool_name]
    response = operator_api.post(f"/api/pools/{pool.pk}/floor/", {"floor_gpus": floor}, "json")
    error = assert_error(response, 400, "invalid")
    assert list(error["fields"]) == ["floor_gpus"]
    pool.refresh_from_db()
    assert pool.floor_gpus == 0


def test_the_schema_documents_the_bounds_of_a_requests_integers(operator_api, db):
    schema = operator_api.get("/api/schema/", {"format": "json"}).json()
    floor = schema["components"]["schemas"]["PoolFloorRequest"]["properties"]["floor_gpus"]
    assert floor["maximum"] == 2**31 - 1
