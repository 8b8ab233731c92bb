"""Text the API cannot take is a 400 naming the field, checked once for every endpoint by its
parsers (gpucap/api/parsers.py): NUL and other control characters anywhere, lone surrogates,
bidi controls in names; JSON too deep or too large. Nothing changes."""

import json

import pytest

from gpucap.fleet.models import Cluster, Node, Pool
from gpucap.rentals.models import VirtualMachine
from gpucap.tenancy.models import Membership
from tests.test_api_errors import assert_error


def raw_json(client, method: str, path: str, body: str):
    return client.generic(method, path, body.encode(), content_type="application/json")


def test_nul_in_a_pools_tenants_is_a_400_naming_it(operator_api, fleet_east):
    pool = fleet_east["pools"]["h100-spot"]
    response = operator_api.patch(
        f"/api/pools/{pool.pk}/", {"tenants": ["acme", "glo\x00bex"]}, format="json"
    )
    error = assert_error(response, 400, "invalid")
    assert error["fields"] == {"tenants[1]": ["contains the control character U+0000"]}
    assert list(Pool.objects.get(pk=pool.pk).tenants.values_list("slug", flat=True)) == ["acme"]


def test_nul_in_a_vm_requests_tenant_is_a_400(operator_api, fleet_east):
    body = {
        "tenant": "ac\x00me",
        "pool": fleet_east["pools"]["h100-spot"].pk,
        "name": "train-01",
        "gpu_count": 1,
    }
    error = assert_error(operator_api.post("/api/vms/", body, format="json"), 400, "invalid")
    assert list(error["fields"]) == ["tenant"]
    assert not VirtualMachine.objects.exists()


def test_nul_in_a_node_label_is_a_400_naming_the_label(operator_api, fleet_east):
    node = fleet_east["nodes"]["a100-001"]
    response = operator_api.patch(
        f"/api/nodes/{node.pk}/", {"labels": {"rack": "r\x0012"}}, format="json"
    )
    error = assert_error(response, 400, "invalid")
    assert error["fields"] == {"labels.rack": ["contains the control character U+0000"]}
    assert Node.objects.get(pk=node.pk).labels == node.labels


def test_nul_in_driver_settings_is_a_400(operator_api, fleet_east):
    cluster = fleet_east["cluster"]
    response = operator_api.patch(
        f"/api/clusters/{cluster.pk}/", {"driver_settings": {"seed": "\x00"}}, format="json"
    )
    error = assert_error(response, 400, "invalid")
    assert list(error["fields"]) == ["driver_settings.seed"]
    assert Cluster.objects.get(pk=cluster.pk).driver_settings == cluster.driver_settings


def test_a_lone_surrogate_in_a_role_is_a_400(member_api, member, tenant):
    membership = Membership.objects.get(user=member)
    response = raw_json(
        member_api,
        "PATCH",
        f"/api/tenants/{tenant.pk}/members/{membership.pk}/",
        '{"role": "\\ud800"}',
    )
    error = assert_error(response, 400, "invalid")
    assert "lone surrogate" in error["fields"]["role"][0]
    assert Membership.objects.get(pk=membership.pk).role == "admin"


@pytest.mark.parametrize("char", ["\u202e", "\u2066"])
def test_a_bidi_override_in_a_name_is_a_400(operator_api, fleet_east, char):
    body = {"name": f"east{char}-2", "driver": "simulated"}
    error = assert_error(operator_api.post("/api/clusters/", body, format="json"), 400, "invalid")
    assert "bidirectional" in error["fields"]["name"][0]
    assert not Cluster.objects.filter(name__startswith="east\u202e").exists()


def test_a_control_character_in_a_form_encoded_body_is_a_400(operator_api, fleet_east):
    node = fleet_east["nodes"]["a100-001"]
    response = operator_api.patch(f"/api/nodes/{node.pk}/", {"gpu_model": "A100\x00"})
    error = assert_error(response, 400, "invalid")
    assert list(error["fields"]) == ["gpu_model"]


def test_json_nested_50000_deep_is_a_400(operator_api, db):
    body = '{"name": ' + "[" * 50_000 + "]" * 50_000 + "}"
    error = assert_error(raw_json(operator_api, "POST", "/api/clusters/", body), 400, "parse_error")
    assert "nested more than 32 levels" in error["message"]


def test_a_body_over_the_upload_limit_is_a_413(operator_api, db, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    body = json.dumps({"name": "x" * 20_000, "driver": "simulated"})
    error = assert_error(raw_json(operator_api, "POST", "/api/clusters/", body), 413, "too_large")
    assert "over 10000 bytes" in error["message"]
    assert not Cluster.objects.exists()


@pytest.mark.parametrize(
    ("query", "parameter"),
    [("tenant=ac%00me", "tenant"), ("tenant=ac%E2%80%AEme", "tenant"), ("state=x%01", "state")],
)
def test_a_query_parameter_with_a_control_character_is_a_400_naming_it(
    member_api, fleet_east, query, parameter
):
    error = assert_error(member_api.get(f"/api/vms/?{query}"), 400, "invalid")
    assert list(error["fields"]) == [parameter]
