"""A node's guest bridge and guest subnet: set through the API, the admin and fleet files,
checked with a 400 naming the field (and, for an overlap, the other node), never overlapping
another node's subnet — by the database too — and fixed while guests hold GPUs on the node."""

import textwrap

import pytest
from django.db import IntegrityError, transaction
from django.urls import reverse

from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node
from tests.fleet.test_api import error_fields
from tests.fleet.test_fleetfile import FLEET, apply, edited, export, refused

pytestmark = pytest.mark.django_db


def node_payload(cluster, hostname: str, **network) -> dict:
    return {
        "cluster": cluster.pk,
        "hostname": hostname,
        "gpu_model": "L40S",
        "fabric": "pcie",
        "gpu_count": 4,
        **network,
    }


@pytest.fixture
def with_subnet(fleet_east):
    """l40s-001 gives its guests addresses from 10.200.0.0/24 over gpubr0."""
    return fleet.node_update(
        node=fleet_east["nodes"]["l40s-001"], guest_bridge="gpubr0", guest_subnet="10.200.0.0/24"
    )


# --- the API --------------------------------------------------------------------------------------


def test_a_node_is_created_with_its_guest_network_and_shows_it(operator_api, fleet_east):
    response = operator_api.post(
        "/api/nodes/",
        node_payload(
            fleet_east["cluster"], "l40s-009", guest_bridge="gpubr0", guest_subnet="10.201.0.0/24"
        ),
        format="json",
    )

    assert response.status_code == 201, response.data
    assert (response.data["guest_bridge"], response.data["guest_subnet"]) == (
        "gpubr0",
        "10.201.0.0/24",
    )
    shown = operator_api.get(f"/api/nodes/{response.data['id']}/").data
    assert (shown["guest_bridge"], shown["guest_subnet"]) == ("gpubr0", "10.201.0.0/24")


def test_an_overlapping_subnet_is_a_400_naming_the_field_and_the_other_node(
    operator_api, fleet_east, with_subnet
):
    target = fleet_east["nodes"]["l40s-002"]

    response = operator_api.patch(
        f"/api/nodes/{target.pk}/",
        {"guest_bridge": "gpubr0", "guest_subnet": "10.200.0.128/25"},
        format="json",
    )

    assert response.status_code == 400
    problem = error_fields(response)["guest_subnet"][0]
    assert "10.200.0.128/25 overlaps 10.200.0.0/24 of node l40s-001" in problem
    target.refresh_from_db()
    assert target.guest_subnet == ""


def test_a_created_node_whose_subnet_overlaps_is_refused_and_not_created(
    operator_api, fleet_east, with_subnet
):
    response = operator_api.post(
        "/api/nodes/",
        node_payload(
            fleet_east["cluster"], "l40s-009", guest_bridge="br1", guest_subnet="10.0.0.0/8"
        ),
        format="json",
    )

    assert response.status_code == 400
    assert "of node l40s-001" in error_fields(response)["guest_subnet"][0]
    assert not Node.objects.filter(hostname="l40s-009").exists()


@pytest.mark.parametrize(
    ("payload", "field", "reason"),
    [
        ({"guest_bridge": "br/0"}, "guest_bridge", "not a Linux interface name"),
        ({"guest_bridge": "a-bridge-name-too-long"}, "guest_bridge", "1-15"),
        ({"guest_bridge": "br0", "guest_subnet": "10.200.0.5/24"}, "guest_subnet", "host bits"),
        ({"guest_bridge": "br0", "guest_subnet": "fd00::/64"}, "guest_subnet", "IPv4"),
        ({"guest_bridge": "br0", "guest_subnet": "10.200.0.0"}, "guest_subnet", "CIDR"),
        ({"guest_bridge": "br0", "guest_subnet": "10.200.0.0/31"}, "guest_subnet", "no room"),
        ({"guest_subnet": "10.200.0.0/24"}, "guest_bridge", "required with a guest_subnet"),
    ],
)
def test_a_bad_guest_network_is_a_400_naming_the_field(
    operator_api, fleet_east, payload, field, reason
):
    node = fleet_east["nodes"]["l40s-002"]

    response = operator_api.patch(f"/api/nodes/{node.pk}/", payload, format="json")

    assert response.status_code == 400
    assert reason in error_fields(response)[field][0]


def test_the_subnet_can_be_cleared_and_taken_by_another_node(operator_api, fleet_east, with_subnet):
    other = fleet_east["nodes"]["l40s-002"]

    cleared = operator_api.patch(
        f"/api/nodes/{with_subnet.pk}/", {"guest_subnet": ""}, format="json"
    )
    taken = operator_api.patch(
        f"/api/nodes/{other.pk}/",
        {"guest_bridge": "gpubr0", "guest_subnet": "10.200.0.0/24"},
        format="json",
    )

    assert (cleared.status_code, cleared.data["guest_subnet"]) == (200, "")
    assert (taken.status_code, taken.data["guest_subnet"]) == (200, "10.200.0.0/24")


def test_tenant_members_cannot_see_or_change_a_nodes_guest_network(member_api, with_subnet):
    assert member_api.get(f"/api/nodes/{with_subnet.pk}/").status_code == 403
    response = member_api.patch(
        f"/api/nodes/{with_subnet.pk}/", {"guest_subnet": "10.9.0.0/24"}, format="json"
    )
    assert response.status_code == 403


def test_the_database_refuses_overlapping_subnets_whatever_the_code_does(fleet_east, with_subnet):
    other = fleet_east["nodes"]["l40s-002"]

    with pytest.raises(IntegrityError), transaction.atomic():
        Node.objects.filter(pk=other.pk).update(guest_bridge="br0", guest_subnet="10.200.0.64/26")
    with pytest.raises(IntegrityError), transaction.atomic():
        Node.objects.filter(pk=other.pk).update(guest_subnet="10.201.0.0/24")  # no bridge


# --- the admin ------------------------------------------------------------------------------------


def test_the_admin_refuses_an_overlapping_subnet_naming_the_other_node(
    operator_client, operator, fleet_east, with_subnet
):
    operator.is_superuser = True
    operator.save()
    node = fleet_east["nodes"]["l40s-002"]

    response = operator_client.post(
        f"/admin/fleet/node/{node.pk}/change/",
        {
            "bmc_address": "",
            "labels": "{}",
            "guest_bridge": "gpubr0",
            "guest_subnet": "10.200.0.0/24",
            "gpus-TOTAL_FORMS": "0",
            "gpus-INITIAL_FORMS": "0",
        },
    )

    assert response.status_code == 200  # the form again, with the error
    assert "overlaps 10.200.0.0/24 of node l40s-001" in response.content.decode()
    node.refresh_from_db()
    assert node.guest_subnet == ""


# --- fleet files ----------------------------------------------------------------------------------


@pytest.fixture
def fleet_file(tmp_path):
    def write(text: str, name: str = "fleet.yaml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


WITH_SUBNETS = edited(
    edited(
        FLEET,
        'bmc_address: "10.20.12.{}"',
        'bmc_address: "10.20.12.{}"\n'
        '        guest_bridge: gpubr0\n        guest_subnet: "10.200.{}.0/24"',
    ),
    "{hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8}",
    "{hostname: a100-001, gpu_model: A100-SXM4-80GB, fabric: nvswitch, gpus: 8, "
    "guest_bridge: gpubr0, guest_subnet: 10.210.0.0/16}",
)


def test_a_fleet_file_gives_numbered_nodes_their_own_subnets_and_exports_them(fleet_file):
    apply(fleet_file(WITH_SUBNETS))

    subnets = dict(Node.objects.exclude(guest_subnet="").values_list("hostname", "guest_subnet"))
    assert subnets == {
        "h100-001": "10.200.1.0/24",
        "h100-002": "10.200.2.0/24",
        "h100-003": "10.200.3.0/24",
        "a100-001": "10.210.0.0/16",
    }
    assert Node.objects.get(hostname="h100-002").guest_bridge == "gpubr0"
    exported = export()
    assert "guest_subnet: 10.210.0.0/16" in exported
    # The exported file applies to the same fleet without a change.
    assert "nothing to change" in apply(fleet_file(exported, name="exported.yaml"))


def test_overlapping_subnets_in_one_file_are_refused_naming_both_nodes(fleet_file):
    text = edited(WITH_SUBNETS, "guest_subnet: 10.210.0.0/16", "guest_subnet: 10.200.0.0/16")

    problems = refused(fleet_file(text))

    assert (
        "guest_subnet: 10.200.0.0/16 overlaps 10.200.1.0/24 of clusters[0].nodes[0] (h100-001)"
        in problems
    )
    assert not Node.objects.exists()


def test_a_file_subnet_overlapping_a_node_outside_the_file_is_refused(fleet_file, fleet_east):
    # The fixture's cluster east holds nodes the file (about a cluster west) leaves out.
    fleet.node_update(
        node=fleet_east["nodes"]["l40s-001"], guest_bridge="br9", guest_subnet="10.210.4.0/24"
    )
    text = edited(WITH_SUBNETS, "name: east", "name: west")

    problems = refused(fleet_file(text))

    assert "10.210.0.0/16 overlaps 10.210.4.0/24 of node l40s-001 (cluster east" in problems


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (
            'guest_subnet: "10.200.{}.0/24"',
            'guest_subnet: "10.200.0.0/24"',
            "cannot be the subnet of 3 nodes",
        ),
        ("guest_bridge: gpubr0\n        ", "", "guest_bridge: is required with a guest_subnet"),
        ("guest_subnet: 10.210.0.0/16", "guest_subnet: 10.210.0.1/16", "has host bits set"),
    ],
)
def test_a_bad_guest_network_in_a_fleet_file_is_refused_by_name(fleet_file, old, new, reason):
    problems = refused(fleet_file(edited(WITH_SUBNETS, old, new)))

    assert reason in problems


def test_the_node_page_shows_its_guest_bridge_and_subnet(operator_client, with_subnet):
    page = operator_client.get(reverse("fleet:node-detail", args=["east", "l40s-001"]))

    assert page.status_code == 200
    assert "<code>gpubr0</code>" in page.content.decode()
    assert "<code>10.200.0.0/24</code>" in page.content.decode()
