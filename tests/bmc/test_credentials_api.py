"""A node's BMC credentials through the API: ``PUT /api/nodes/{id}/bmc/`` stores them (the
password write-only, sealed, audited as "changed"), ``GET`` says whether a password is set and
when, never the password, and ``DELETE`` forgets them. Bad input is a 400 naming the field, and
nothing is stored."""

import json

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.bmc.models import BmcCredential
from gpucap.bmc.services import bmc_target
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster

PASSWORD = "Tr0ub4dor&3-bmc"


@pytest.fixture
def node(db):
    cluster = fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)
    return fleet.node_create(
        cluster=cluster,
        hostname="h100-001",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
        bmc_address="https://10.0.0.5",
    )


def url(node) -> str:
    return f"/api/nodes/{node.pk}/bmc/"


def test_the_password_is_stored_sealed_and_never_shown(node, operator_api):
    answer = operator_api.put(
        url(node), {"username": "admin", "password": PASSWORD, "verify_tls": False}, format="json"
    )

    assert answer.status_code == 200
    body = answer.json()
    assert PASSWORD not in json.dumps(body)
    stored = BmcCredential.objects.get(node=node)
    assert body == {
        "node": node.pk,
        "hostname": "h100-001",
        "address": "https://10.0.0.5",
        "username": "admin",
        "password_set": True,
        "verify_tls": False,
        "system_id": "",
        "updated_at": body["updated_at"],
    }
    assert body["updated_at"].startswith(stored.updated_at.strftime("%Y-%m-%dT%H:%M"))
    assert PASSWORD not in stored.password_sealed
    assert bmc_target(node).password == PASSWORD
    assert operator_api.get(url(node)).json() == body
    event = AuditEvent.objects.get(verb="bmc.credential_set")
    assert event.after["password"] == "changed"
    assert PASSWORD not in json.dumps([event.before, event.after])


def test_a_put_without_the_password_keeps_the_stored_one(node, operator_api):
    operator_api.put(url(node), {"username": "admin", "password": PASSWORD}, format="json")

    answer = operator_api.put(url(node), {"username": "root"}, format="json")

    assert answer.status_code == 200
    assert (answer.json()["username"], answer.json()["verify_tls"]) == ("root", True)
    assert bmc_target(node).password == PASSWORD


def test_a_node_without_credentials_says_so(node, operator_api):
    assert operator_api.get(url(node)).json()["password_set"] is False


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"username": "admin"}, {"password": ["is required for a BMC without stored credentials"]}),
        ({"password": PASSWORD}, {"username": ["This field is required."]}),
        ({"username": "", "password": PASSWORD}, {"username": ["This field may not be blank."]}),
        (
            {"username": "admin", "password": PASSWORD, "verify_tls": "no"},
            {"verify_tls": ['must be true or false, not "no"']},
        ),
        (
            {"username": "admin", "password": PASSWORD, "system_id": "../1"},
            {"system_id": ["must be a Redfish id: letters, digits, '.', '_' and '-' (at most 64)"]},
        ),
        (
            {"username": "admin", "password": PASSWORD, "address": "10.0.0.6"},
            {"address": ["cannot be set by this request"]},
        ),
        ({"username": "admin", "password": ""}, {"password": ["This field may not be blank."]}),
    ],
)
def test_bad_credentials_are_a_400_naming_the_field(node, operator_api, body, fields):
    answer = operator_api.put(url(node), body, format="json")

    assert answer.status_code == 400
    assert answer.json()["error"]["fields"] == fields
    assert not BmcCredential.objects.exists()


def test_a_node_without_a_bmc_address_gets_no_credentials(node, operator_api):
    fleet.node_update(node=node, bmc_address="")

    answer = operator_api.put(url(node), {"username": "admin", "password": PASSWORD}, format="json")

    assert answer.status_code == 400
    assert answer.json()["error"]["fields"] == {
        "bmc_address": ["node h100-001 has no BMC address; set it first"]
    }


def test_delete_forgets_the_credentials_and_keeps_the_address(node, operator_api):
    operator_api.put(url(node), {"username": "admin", "password": PASSWORD}, format="json")

    assert operator_api.delete(url(node)).status_code == 204

    assert not BmcCredential.objects.exists()
    body = operator_api.get(url(node)).json()
    assert (body["password_set"], body["address"]) == (False, "https://10.0.0.5")
    assert AuditEvent.objects.filter(verb="bmc.credential_delete").count() == 1
    assert operator_api.delete(url(node)).status_code == 204  # forgetting twice is harmless


def test_only_operators_see_or_set_credentials(node, member_api, anonymous_api):
    body = {"username": "admin", "password": PASSWORD}
    assert member_api.get(url(node)).status_code == 403
    assert member_api.put(url(node), body, format="json").status_code == 403
    assert anonymous_api.put(url(node), body, format="json").status_code == 401
    assert not BmcCredential.objects.exists()


def test_an_unknown_node_is_a_404(db, operator_api):
    answer = operator_api.put("/api/nodes/999999/bmc/", {"username": "a", "password": "b"})
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"
