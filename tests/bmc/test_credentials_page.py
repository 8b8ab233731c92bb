"""The BMC panel's credentials form (console/node_bmc_credentials.html): an operator sets the
user, the password (never shown back; empty keeps the stored one), whether the certificate is
verified (off is shown in red) and the system id, through the same service as the API, which
audits it; Remove forgets them, confirmed. Bad input is answered next to its field (400) and
changes nothing. Operators only."""

import pytest
from django.urls import reverse

from gpucap.audit.models import AuditEvent
from gpucap.bmc.models import BmcCredential
from gpucap.bmc.passwords import password_open
from gpucap.bmc.services import bmc_credential_set
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node

HTMX = {"HX-Request": "true"}
PASSWORD = "s3cret-bmc-password"


@pytest.fixture
def node(db) -> Node:
    cluster = fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)
    return fleet.node_create(
        cluster=cluster,
        hostname="h100-001",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
        bmc_address="https://10.0.0.5",
    )


def url(node: Node, name: str = "node-bmc-credentials") -> str:
    return reverse(f"fleet:{name}", args=[node.cluster.name, node.hostname])


def form(**fields) -> dict:
    data = {"username": "admin", "password": PASSWORD, "verify_tls": "on", "system_id": ""}
    data.update(fields)
    return {key: value for key, value in data.items() if value is not None}


def stored(node: Node) -> dict | None:
    credential = BmcCredential.objects.filter(node=node).first()
    if credential is None:
        return None
    return {
        "username": credential.username,
        "password": password_open(credential.password_sealed, node=node.hostname),
        "verify_tls": credential.verify_tls,
        "system_id": credential.system_id,
    }


def test_an_operator_sets_the_credentials_and_the_password_is_never_shown(
    node, operator, operator_client
):
    page = operator_client.get(reverse("fleet:node-detail", args=["east", "h100-001"]))
    panel = page.content.decode().split('id="node-bmc"')[1].split("</section>")[0]
    assert "Set credentials" in panel and 'name="password"' in panel
    assert "none stored: set them below" in panel

    answer = operator_client.post(url(node), form(system_id="1"), headers=HTMX)

    assert answer.status_code == 200
    fragment = answer.content.decode()
    assert fragment.lstrip().startswith('<section class="panel node-bmc" id="node-bmc"')
    assert "Credentials saved." in fragment and "password set" in fragment
    assert "<code>admin</code>" in fragment and "<code>1</code>" in fragment
    assert PASSWORD not in fragment
    assert stored(node) == {
        "username": "admin",
        "password": PASSWORD,
        "verify_tls": True,
        "system_id": "1",
    }
    event = AuditEvent.objects.get(verb="bmc.credential_set")
    assert event.actor == operator and event.after["password"] == "changed"
    assert PASSWORD not in str(event.before) + str(event.after)


def test_an_empty_password_keeps_the_stored_one(node, operator_client):
    bmc_credential_set(node=node, username="admin", password=PASSWORD)

    answer = operator_client.post(url(node), form(username="root", password=""), headers=HTMX)

    assert answer.status_code == 200
    assert stored(node)["username"] == "root" and stored(node)["password"] == PASSWORD
    event = AuditEvent.objects.filter(verb="bmc.credential_set").latest("pk")
    assert event.after["password"] == "unchanged"
    # The form shows the stored values back, the password never.
    fragment = answer.content.decode()
    assert 'name="username" value="root"' in fragment
    assert (
        'type="password" name="password"' in fragment
        and "value=" not in (fragment.split('name="password"')[1].split(">")[0])
    )
    assert "Leave it empty to keep the stored one" in fragment


def test_turning_tls_verification_off_is_warned_of_and_shown_in_red(node, operator_client):
    bmc_credential_set(node=node, username="admin", password=PASSWORD)

    answer = operator_client.post(url(node), form(password="", verify_tls=None), headers=HTMX)

    fragment = answer.content.decode()
    assert stored(node)["verify_tls"] is False
    assert '<span class="bad tls-off">TLS not verified</span>' in fragment
    warning = fragment.split('class="small bad tls-warning"')[1].split("</p>")[0]
    assert "Unticked, gpucap accepts any certificate" in warning and "in red" in warning


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        ({"username": ""}, "username", "User: is required"),
        ({"username": "ad\x00min"}, "username", "User: "),
        ({"username": "a" * 129}, "username", "User: Ensure this value has at most 128"),
        ({"password": ""}, "password", "Password: is required for a BMC without stored"),
        ({"password": "p" * 257}, "password", "Password: Ensure this value has at most 256"),
        ({"system_id": "System 1!"}, "system_id", "System id: must be a Redfish id"),
    ],
)
def test_bad_input_is_answered_next_to_its_field_and_changes_nothing(
    node, operator_client, fields, field, reason
):
    answer = operator_client.post(url(node), form(**fields), headers=HTMX)

    assert answer.status_code == 400
    fragment = answer.content.decode()
    invalid = fragment.split(f'class="field field-{field} field-invalid"')[1].split("</div>")[0]
    assert f'<p class="field-error" id="id_{field}-error">{reason}' in invalid
    assert PASSWORD not in fragment
    assert stored(node) is None and not AuditEvent.objects.filter(verb__startswith="bmc.").exists()


def test_a_bad_change_keeps_what_was_stored(node, operator_client):
    bmc_credential_set(node=node, username="admin", password=PASSWORD, system_id="1")
    before = stored(node)

    answer = operator_client.post(
        url(node), form(username="root", password="new-one", system_id="no way"), headers=HTMX
    )

    assert answer.status_code == 400
    assert stored(node) == before
    assert "new-one" not in answer.content.decode()


def test_a_node_without_a_bmc_address_gets_no_form_and_is_told_why(node, operator_client):
    node = fleet.node_update(node=node, bmc_address="")
    page = operator_client.get(reverse("fleet:node-detail", args=["east", "h100-001"]))
    assert "Set credentials" not in page.content.decode()

    answer = operator_client.post(url(node), form(), headers=HTMX)

    assert answer.status_code == 400
    assert "node h100-001 has no BMC address; set it first" in answer.content.decode()
    assert stored(node) is None


def test_remove_forgets_them_after_a_confirmation(node, operator, operator_client):
    bmc_credential_set(node=node, username="admin", password=PASSWORD)
    page = operator_client.get(reverse("fleet:node-detail", args=["east", "h100-001"]))
    remove = page.content.decode().split('class="bmc-credentials-remove"')[1].split(">")[0]
    assert 'hx-confirm="Remove the BMC credentials of h100-001?' in remove

    answer = operator_client.post(url(node, "node-bmc-credentials-delete"), headers=HTMX)

    assert answer.status_code == 200
    assert "Credentials removed." in answer.content.decode()
    assert stored(node) is None
    assert Node.objects.get(pk=node.pk).bmc_address == "https://10.0.0.5"
    assert AuditEvent.objects.get(verb="bmc.credential_delete").actor == operator


def test_without_htmx_a_saved_form_goes_back_to_the_node_page_and_a_bad_one_stays(
    node, operator_client
):
    saved = operator_client.post(url(node), form())
    assert saved.status_code == 302 and saved["Location"] == "/fleet/nodes/east/h100-001/"

    refused = operator_client.post(url(node), form(username=""))
    assert refused.status_code == 400
    assert "<title>" in refused.content.decode()  # the whole node page
    assert "User: is required" in refused.content.decode()


def test_tenants_and_visitors_cannot_touch_them(node, member_client, client):
    bmc_credential_set(node=node, username="admin", password=PASSWORD)
    before = stored(node)
    for target in (url(node), url(node, "node-bmc-credentials-delete")):
        assert member_client.post(target, form(username="mallory")).status_code == 403
        assert client.post(target, form(username="mallory")).status_code == 302  # to sign in
    assert stored(node) == before
