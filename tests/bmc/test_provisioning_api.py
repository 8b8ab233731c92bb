"""``/api/nodes/<id>/provisioning/``: operators start a node's provisioning by virtual media
and read its progress; bad input is a 400 naming the field, a node that may not be provisioned
a 409 saying why, and neither changes anything. No BMC is spoken to here: the steps run in the
task (tests/bmc/test_provisioning.py, tests/realguest/test_provisioning.py)."""

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.bmc.models import Provisioning
from gpucap.bmc.services import bmc_credential_set
from gpucap.fleet import services as fleet

IMAGE = "https://images.example/installer.iso"


@pytest.fixture
def node(fleet_east, operator):
    node = fleet_east["nodes"]["a100-001"]
    node.bmc_address = "https://10.0.0.5"
    node.save(update_fields=["bmc_address"])
    bmc_credential_set(node=node, username="admin", password="bmc-password")
    return fleet.node_cordon(node=node, actor=operator)


def _url(node) -> str:
    return f"/api/nodes/{node.pk}/provisioning/"


def test_an_operator_starts_a_run_and_reads_its_progress(operator_api, node):
    started = operator_api.post(_url(node), {"image_url": IMAGE}, format="json")

    assert started.status_code == 201, started.content
    body = started.json()
    assert (body["hostname"], body["image_url"], body["state"]) == ("a100-001", IMAGE, "inserting")
    assert body["in_progress"] is True and body["requested_by"] == "olivia"
    assert [(step["state"], step["status"]) for step in body["steps"]] == [
        ("inserting", "current"),
        ("booting", "pending"),
        ("waiting", "pending"),
        ("done", "pending"),
    ]

    read = operator_api.get(_url(node)).json()
    assert read["in_progress"] is True
    assert [run["id"] for run in read["runs"]] == [body["id"]]


def test_a_node_never_provisioned_has_no_runs(operator_api, node):
    assert operator_api.get(_url(node)).json() == {
        "node": node.pk,
        "hostname": "a100-001",
        "in_progress": False,
        "runs": [],
    }


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({}, "This field is required."),
        ({"image_url": ""}, "is required"),
        ({"image_url": "ftp://images.example/a.iso"}, "must be an http:// or https:// URL"),
        ({"image_url": 7}, "must be text"),
    ],
)
def test_an_image_url_that_is_no_web_address_is_a_400_naming_it(operator_api, node, body, reason):
    events = AuditEvent.objects.count()

    response = operator_api.post(_url(node), body, format="json")

    assert response.status_code == 400
    assert reason in response.json()["error"]["fields"]["image_url"][0]
    assert not Provisioning.objects.exists()
    assert AuditEvent.objects.count() == events


def test_a_field_it_does_not_know_is_refused_by_name(operator_api, node):
    response = operator_api.post(_url(node), {"image_url": IMAGE, "reset": "On"}, format="json")

    assert response.status_code == 400
    assert "reset" in response.json()["error"]["fields"]


def test_a_node_in_service_is_a_409_saying_why(operator_api, node, operator):
    fleet.node_uncordon(node=node, actor=operator)

    response = operator_api.post(_url(node), {"image_url": IMAGE}, format="json")

    assert response.status_code == 409
    assert response.json()["error"]["message"].startswith(
        "node a100-001 is ready: provisioning boots it from another image"
    )
    assert not Provisioning.objects.exists()


def test_a_second_run_while_one_runs_is_a_409(operator_api, node):
    operator_api.post(_url(node), {"image_url": IMAGE}, format="json")

    response = operator_api.post(_url(node), {"image_url": IMAGE}, format="json")

    assert response.status_code == 409
    assert "is being provisioned already" in response.json()["error"]["message"]
    assert Provisioning.objects.count() == 1


def test_tenants_may_neither_start_nor_read_one(member_api, node):
    assert member_api.post(_url(node), {"image_url": IMAGE}, format="json").status_code == 403
    assert member_api.get(_url(node)).status_code == 403
    assert not Provisioning.objects.exists()


def test_a_node_that_does_not_exist_is_a_404(operator_api):
    response = operator_api.post("/api/nodes/999999/provisioning/", {"image_url": IMAGE})

    assert response.status_code == 404
