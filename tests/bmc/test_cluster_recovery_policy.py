"""The cluster page's recovery policy (console/cluster_recovery.html): shown in words, and set by
a form through the service ``PUT /api/clusters/<id>/recovery-policy/`` uses (the same rules,
audited); turning the automatic power cycle on asks for a confirmation first and saves nothing
until it is given. Bad input is answered next to its field and changes nothing. Operators
only."""

import pytest
from django.urls import reverse

from gpucap.audit.models import AuditEvent
from gpucap.bmc import recovery
from gpucap.bmc.recovery_models import RecoveryPolicy
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster

HTMX = {"HX-Request": "true"}
URL = "/fleet/clusters/east/recovery-policy/"


@pytest.fixture
def east(db) -> Cluster:
    return fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)


def form(**fields) -> dict:
    data = {"grace_seconds": "600", "max_attempts": "3", "boot_timeout_seconds": "900"}
    data.update(fields)
    return {key: value for key, value in data.items() if value is not None}


def policy(cluster: Cluster) -> dict:
    found = recovery.policy_of(cluster)
    return {
        "auto_power_cycle": found.auto_power_cycle,
        "grace_seconds": found.grace_seconds,
        "max_attempts": found.max_attempts,
        "boot_timeout_seconds": found.boot_timeout_seconds,
    }


def test_the_cluster_page_shows_the_policy_and_its_form(east, operator_client):
    page = operator_client.get(reverse("fleet:cluster-detail", args=["east"])).content.decode()

    panel = page.split('id="cluster-recovery"')[1].split("</section>")[0]
    assert "<h2>Recovery policy</h2>" in panel
    assert '<span class="badge">Manual</span> A down node waits for an operator' in panel
    assert "after 3 failed power cycles in a row" in panel and "900 s to answer" in panel
    assert "The defaults: never set." in panel
    assert 'name="grace_seconds" value="600"' in panel
    assert 'name="auto_power_cycle"' in panel and "checked" not in panel


def test_the_numbers_are_saved_and_audited(east, operator, operator_client):
    answer = operator_client.post(
        URL, form(grace_seconds="120", max_attempts="5", boot_timeout_seconds="1200"), headers=HTMX
    )

    assert answer.status_code == 200
    fragment = answer.content.decode()
    assert fragment.lstrip().startswith('<section class="panel cluster-recovery"')
    assert "Recovery policy saved." in fragment and "after 5 failed power cycles" in fragment
    assert policy(east) == {
        "auto_power_cycle": False,
        "grace_seconds": 120,
        "max_attempts": 5,
        "boot_timeout_seconds": 1200,
    }
    event = AuditEvent.objects.get(verb="bmc.recovery_policy")
    assert event.actor == operator
    assert event.before["grace_seconds"] == 600 and event.after["grace_seconds"] == 120


def test_turning_the_automatic_power_cycle_on_is_confirmed_first(east, operator_client):
    asked = operator_client.post(
        URL, form(auto_power_cycle="on", grace_seconds="300"), headers=HTMX
    )

    assert asked.status_code == 200
    fragment = asked.content.decode()
    assert "Turn on automatic power cycles for east?" in fragment
    assert "down for 300 s is forced off and switched on again through its BMC" in fragment
    assert 'name="confirmed" value="on"' in fragment
    assert 'name="grace_seconds" value="300"' in fragment
    assert not RecoveryPolicy.objects.exists()
    assert not AuditEvent.objects.filter(verb="bmc.recovery_policy").exists()

    confirmed = operator_client.post(
        URL, form(auto_power_cycle="on", grace_seconds="300", confirmed="on"), headers=HTMX
    )

    assert confirmed.status_code == 200
    assert '<span class="badge badge-enforce">Automatic</span> A node down for 300 s' in (
        confirmed.content.decode()
    )
    assert policy(east)["auto_power_cycle"] is True and policy(east)["grace_seconds"] == 300
    assert AuditEvent.objects.get(verb="bmc.recovery_policy").after["auto_power_cycle"] is True


def test_changes_that_do_not_turn_it_on_need_no_confirmation(east, operator_client):
    recovery.recovery_policy_set(cluster=east, actor=None, auto_power_cycle=True)

    kept_on = operator_client.post(URL, form(auto_power_cycle="on", grace_seconds="60"))
    assert kept_on.status_code == 302 and policy(east)["grace_seconds"] == 60

    turned_off = operator_client.post(URL, form(), headers=HTMX)
    assert "Recovery policy saved." in turned_off.content.decode()
    assert policy(east)["auto_power_cycle"] is False


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        ({"grace_seconds": "-1"}, "grace_seconds", "must be between 0 and 604800, got -1"),
        ({"grace_seconds": "604801"}, "grace_seconds", "must be between 0 and 604800, got"),
        ({"max_attempts": "0"}, "max_attempts", "must be between 1 and 20, got 0"),
        ({"max_attempts": "21"}, "max_attempts", "must be between 1 and 20, got 21"),
        ({"boot_timeout_seconds": "0"}, "boot_timeout_seconds", "must be between 1 and 86400"),
        ({"grace_seconds": "ten"}, "grace_seconds", "must be a whole number"),
        ({"max_attempts": "2.5"}, "max_attempts", "must be a whole number"),
        ({"boot_timeout_seconds": ""}, "boot_timeout_seconds", "is required"),
    ],
)
def test_bad_input_is_answered_next_to_its_field_and_changes_nothing(
    east, operator_client, operator_api, fields, field, reason
):
    for confirmed in ({}, {"auto_power_cycle": "on", "confirmed": "on"}):
        answer = operator_client.post(URL, form(**fields, **confirmed), headers=HTMX)

        assert answer.status_code == 400
        fragment = answer.content.decode()
        invalid = fragment.split(f'class="field field-{field} field-invalid"')[1]
        assert f'<p class="field-error" id="id_{field}-error">' in invalid.split("</div>")[0]
        assert reason in invalid.split("</div>")[0]
        assert "Turn on automatic power cycles" not in fragment
    assert not RecoveryPolicy.objects.exists()
    assert not AuditEvent.objects.filter(verb="bmc.recovery_policy").exists()
    # The API refuses what the page refuses: the same rules.
    value = fields[field]
    number = int(value) if value.lstrip("-").isdigit() else value
    refused = operator_api.put(
        f"/api/clusters/{east.pk}/recovery-policy/", {field: number}, format="json"
    )
    assert refused.status_code == 400 and field in refused.json()["error"]["fields"]


def test_without_htmx_a_refused_form_is_the_whole_page(east, operator_client):
    answer = operator_client.post(URL, form(max_attempts="0"))

    assert answer.status_code == 400
    page = answer.content.decode()
    assert "<title>" in page and "Max attempts: must be between 1 and 20, got 0" in page


def test_the_node_page_links_to_the_policy(east, operator_client):
    fleet.node_create(
        cluster=east, hostname="h100-001", gpu_model="H100", fabric="nvswitch", gpu_count=8
    )

    page = operator_client.get(reverse("fleet:node-detail", args=["east", "h100-001"]))

    assert 'href="/fleet/clusters/east/#cluster-recovery"' in page.content.decode()


def test_tenants_and_visitors_cannot_set_it(east, member_client, client):
    for who, status in ((member_client, 403), (client, 302)):
        assert who.post(URL, form(auto_power_cycle="on", confirmed="on")).status_code == status
        assert who.get(URL, headers=HTMX).status_code == status
    assert not RecoveryPolicy.objects.exists()
