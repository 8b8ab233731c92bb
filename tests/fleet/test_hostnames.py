"""A node's hostname is a DNS hostname on every write: the API, the services (so fleet files),
the admin, and the database itself. ``/``, ``../``, ``<script>`` and ``%00`` were accepted, and
one ``/`` made /fleet/ a 500 until the node was deleted."""

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node
from tests.test_api_errors import assert_error

BAD = ["a/b", "../etc", "<script>", "%00", "h100 001", "-h100", "h100-", "a..b", "a" * 64]


@pytest.mark.parametrize("hostname", BAD)
def test_the_api_refuses_a_hostname_that_is_not_a_dns_hostname(
    operator_api, operator_client, fleet_east, hostname
):
    body = {
        "cluster": fleet_east["cluster"].pk,
        "hostname": hostname,
        "gpu_model": "L4",
        "fabric": "pcie",
        "gpu_count": 1,
    }
    error = assert_error(operator_api.post("/api/nodes/", body, format="json"), 400, "invalid")
    assert list(error["fields"]) == ["hostname"]
    assert "must be a DNS hostname" in error["fields"]["hostname"][0]
    assert not Node.objects.filter(hostname=hostname).exists()
    assert operator_client.get("/fleet/").status_code == 200


@pytest.mark.parametrize("hostname", ["l4-001", "gpu7.rack3.east.example", "A100-X", "n1"])
def test_dns_hostnames_are_taken(fleet_east, hostname):
    node = fleet.node_create(
        cluster=fleet_east["cluster"], hostname=hostname, gpu_model="L4", fabric="pcie", gpu_count=1
    )
    assert node.hostname == hostname


def test_the_service_refuses_it_naming_the_field(fleet_east):
    with pytest.raises(ValidationError) as refused:
        fleet.node_create(
            cluster=fleet_east["cluster"],
            hostname="a/b",
            gpu_model="L4",
            fabric="pcie",
            gpu_count=1,
        )
    assert list(refused.value.message_dict) == ["hostname"]


def test_the_database_refuses_it_too(fleet_east):
    node = fleet_east["nodes"]["a100-001"]
    with pytest.raises(IntegrityError, match="node_hostname_dns"), transaction.atomic():
        Node.objects.filter(pk=node.pk).update(hostname="a/b")


def test_model_forms_and_the_admin_refuse_it(fleet_east, operator_client):
    """The admin edits no hostname (it is not among the node's editable fields there); any
    model form would refuse one through the field's validator."""
    node = fleet_east["nodes"]["a100-001"]
    page = operator_client.get(f"/admin/fleet/node/{node.pk}/change/")
    assert 'name="hostname"' not in page.content.decode()
    node.hostname = "../etc"
    with pytest.raises(ValidationError) as refused:
        node.full_clean()
    assert "must be a DNS hostname" in str(refused.value.message_dict["hostname"])


@pytest.mark.django_db(transaction=True)
def test_the_migration_renames_hostnames_written_before_the_check():
    executor = MigrationExecutor(connection)
    before, after = [("fleet", "0006_image_catalogue")], [("fleet", "0007_node_hostname_dns")]
    executor.migrate(before)
    try:
        apps = executor.loader.project_state(before).apps
        OldCluster, OldNode = apps.get_model("fleet", "Cluster"), apps.get_model("fleet", "Node")
        cluster = OldCluster.objects.create(name="east", driver="simulated")
        made = {
            name: OldNode.objects.create(
                cluster=cluster, hostname=name, gpu_model="L4", fabric="pcie", gpu_count=1
            ).pk
            for name in ["a/b", "a-b", "<script>", "../", "h100-001"]
        }
        executor = MigrationExecutor(connection)
        executor.migrate(after)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    hostnames = dict(Node.objects.values_list("pk", "hostname"))
    assert hostnames[made["a-b"]] == "a-b"
    assert hostnames[made["a/b"]] == f"a-b-{made['a/b']}"  # "a-b" is taken
    assert hostnames[made["<script>"]] == "script"
    assert hostnames[made["../"]] == f"node-{made['../']}"
    assert hostnames[made["h100-001"]] == "h100-001"
    assert Node.objects.get(pk=made["a/b"]).labels == {"gpucap/former-hostname": "a/b"}
