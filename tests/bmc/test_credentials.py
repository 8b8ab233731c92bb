"""A node's BMC credentials: sealed at rest, never shown back, checked before they are stored,
and sealed again when the key rotates. The stored credentials reach the emulated BMC."""

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connection

from gpucap.audit.models import AuditEvent
from gpucap.bmc.models import BmcCredential
from gpucap.bmc.redfish import inventory_read
from gpucap.bmc.services import (
    bmc_credential_delete,
    bmc_credential_set,
    bmc_credentials_reseal,
    bmc_target,
)
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster

PASSWORD = "Tr0ub4dor&3-bmc"


@pytest.fixture
def node(db):
    """A node whose BMC address is a loopback port nothing listens on: these tests never
    reach it, and must not reach anything else."""
    cluster = fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)
    return fleet.node_create(
        cluster=cluster,
        hostname="h100-001",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
        bmc_address="https://127.0.0.1:9",
    )


def _stored_column(node) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT password_sealed FROM bmc_bmccredential WHERE node_id = %s", [node.pk]
        )
        return cursor.fetchone()[0]


def test_the_password_is_sealed_at_rest_and_opens_again(node, operator):
    bmc_credential_set(node=node, username="admin", password=PASSWORD, actor=operator)

    sealed = _stored_column(node)
    assert PASSWORD not in sealed
    assert bmc_target(node).password == PASSWORD


def test_tls_is_verified_unless_turned_off(node):
    bmc_credential_set(node=node, username="admin", password=PASSWORD)
    assert bmc_target(node).verify_tls is True

    bmc_credential_set(node=node, username="admin", password=None, verify_tls=False)
    assert bmc_target(node).verify_tls is False


def test_the_audit_log_never_holds_the_password(node, operator):
    bmc_credential_set(node=node, username="admin", password=PASSWORD, actor=operator)
    bmc_credential_set(node=node, username="root", password="another-one", actor=operator)

    events = list(AuditEvent.objects.filter(verb="bmc.credential_set").order_by("pk"))
    assert [(e.before, e.after) for e in events] == [
        (
            {},
            {"username": "admin", "verify_tls": True, "system_id": "", "password": "changed"},
        ),
        (
            {"username": "admin", "verify_tls": True, "system_id": ""},
            {"username": "root", "verify_tls": True, "system_id": "", "password": "changed"},
        ),
    ]
    assert PASSWORD not in repr(BmcCredential.objects.get(node=node))


def test_setting_the_same_credentials_again_changes_nothing(node):
    bmc_credential_set(node=node, username="admin", password=PASSWORD)
    sealed = _stored_column(node)

    bmc_credential_set(node=node, username="admin", password=PASSWORD)

    assert _stored_column(node) == sealed
    assert AuditEvent.objects.filter(verb="bmc.credential_set").count() == 1


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"username": ""}, {"username": ["is required"]}),
        ({"password": ""}, {"password": ["must not be empty"]}),
        ({"password": None}, {"password": ["is required for a BMC without stored credentials"]}),
        ({"username": "ad\x00min"}, {"username": ["contains the control character U+0000"]}),
        (
            {"system_id": "../1"},
            {"system_id": ["must be a Redfish id: letters, digits, '.', '_' and '-' (at most 64)"]},
        ),
    ],
)
def test_bad_credentials_are_refused_naming_the_field(node, fields, error):
    with pytest.raises(ValidationError) as caught:
        bmc_credential_set(node=node, **{"username": "admin", "password": PASSWORD, **fields})

    assert caught.value.message_dict == error
    assert not BmcCredential.objects.exists()


def test_a_node_without_a_bmc_address_gets_no_credentials(node):
    fleet.node_update(node=node, bmc_address="")

    with pytest.raises(ValidationError) as caught:
        bmc_credential_set(node=node, username="admin", password=PASSWORD)

    assert caught.value.message_dict == {
        "bmc_address": ["node h100-001 has no BMC address; set it first"]
    }


def test_production_without_keys_refuses_to_store_a_password(node, settings):
    settings.DEBUG, settings.BMC_CREDENTIAL_KEYS = False, []

    with pytest.raises(ValidationError) as caught:
        bmc_credential_set(node=node, username="admin", password=PASSWORD)

    assert "BMC_CREDENTIAL_KEYS is not set" in caught.value.message_dict["password"][0]
    assert not BmcCredential.objects.exists()


def test_a_key_rotates_without_losing_a_password(node, settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.BMC_CREDENTIAL_KEYS = [old]
    bmc_credential_set(node=node, username="admin", password=PASSWORD)

    settings.BMC_CREDENTIAL_KEYS = [new, old]
    call_command("bmc_rotate_keys", stdout=open("/dev/null", "w"))  # noqa: SIM115
    settings.BMC_CREDENTIAL_KEYS = [new]

    assert bmc_target(node).password == PASSWORD
    assert bmc_credentials_reseal() == 1


def test_a_password_no_key_opens_is_named(node, settings):
    settings.BMC_CREDENTIAL_KEYS = [Fernet.generate_key().decode()]
    bmc_credential_set(node=node, username="admin", password=PASSWORD)
    settings.BMC_CREDENTIAL_KEYS = [Fernet.generate_key().decode()]

    with pytest.raises(ValidationError) as caught:
        bmc_target(node)

    assert caught.value.message_dict["bmc"] == [
        "node h100-001: its BMC password cannot be opened with the keys in BMC_CREDENTIAL_KEYS "
        "(sealed with a key no longer there?); set the password again"
    ]


def test_forgetting_the_credentials_leaves_the_address(node, operator):
    bmc_credential_set(node=node, username="admin", password=PASSWORD)

    bmc_credential_delete(node=node, actor=operator)

    node.refresh_from_db()
    assert node.bmc_address == "https://127.0.0.1:9"
    with pytest.raises(ValidationError, match="node h100-001 has no BMC credentials"):
        bmc_target(node)


def test_stored_credentials_reach_the_bmc(node, gpu_server_bmc):
    node = fleet.node_update(node=node, bmc_address=gpu_server_bmc.url)
    bmc_credential_set(node=node, username="admin", password=PASSWORD)

    machine = inventory_read(bmc_target(node))

    assert len(machine.gpus) == 8
