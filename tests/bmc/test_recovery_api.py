"""Recovery through the API (docs/bmc.md, Recovery): an operator reads a node's recovery,
power-cycles a down node (the cycle runs in a worker; the answer is the recovery, cycling),
clears a stopped recovery, and reads and sets a cluster's policy. A state that forbids it is a
409 saying why; bad input a 400 naming the field; neither changes anything; tenants are
refused."""

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.bmc.recovery_models import NodeRecovery, RecoveryAttempt, RecoveryPolicy
from gpucap.fleet import services as fleet
from tests.bmc.recovery_helpers import give_bmc


@pytest.fixture
def down(fleet_east, operator, sent_tasks):
    """h100-001 down, with a BMC gpucap has credentials for (nothing answers there: no test
    here runs the cycle itself)."""
    node = give_bmc(fleet_east["nodes"]["h100-001"], "https://10.0.0.5")
    return fleet.node_set_state(node=node, state="down", actor=operator)


def test_a_node_never_down_has_an_idle_recovery(operator_api, fleet_east):
    node = fleet_east["nodes"]["h100-002"]

    response = operator_api.get(f"/api/nodes/{node.pk}/recovery/")

    assert response.status_code == 200
    assert response.json() == {
        "node": node.pk,
        "hostname": "h100-002",
        "node_state": "ready",
        "state": "idle",
        "attempts": 0,
        "down_since": None,
        "next_attempt_at": None,
        "deadline": None,
        "last_error": "",
        "history": [],
    }


def test_an_operator_power_cycles_a_down_node(
    operator_api, down, operator, sent_tasks, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = operator_api.post(f"/api/nodes/{down.pk}/power-cycle/")

    assert response.status_code == 202, response.json()
    body = response.json()
    assert (body["state"], body["node_state"]) == ("cycling", "down")
    [attempt] = body["history"]
    assert (attempt["trigger"], attempt["actor"], attempt["outcome"]) == (
        "operator",
        operator.username,
        "",
    )
    assert sent_tasks == [("bmc.power_cycle", [attempt["id"]])]
    assert AuditEvent.objects.filter(verb="bmc.power_cycle", actor=operator).count() == 1

    again = operator_api.post(f"/api/nodes/{down.pk}/power-cycle/")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "cycle_running"
    assert RecoveryAttempt.objects.count() == 1


def test_a_node_that_is_up_is_not_power_cycled(operator_api, fleet_east, sent_tasks):
    node = fleet_east["nodes"]["h100-002"]

    response = operator_api.post(f"/api/nodes/{node.pk}/power-cycle/")

    assert response.status_code == 409
    assert response.json()["error"] == {
        "code": "node_not_down",
        "message": "node h100-002 is ready, not down: a power cycle would cut the power under "
        "its VMs",
        "fields": {},
    }
    assert not RecoveryAttempt.objects.exists()
    assert sent_tasks == []


def test_a_recovery_that_is_not_stopped_is_not_cleared(operator_api, down):
    response = operator_api.post(f"/api/nodes/{down.pk}/recovery/clear/")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "recovery_not_stopped"


def test_an_operator_clears_a_stopped_recovery(operator_api, down):
    NodeRecovery.objects.filter(node=down).update(state="stopped", attempts=3, last_error="gone")

    response = operator_api.post(f"/api/nodes/{down.pk}/recovery/clear/")

    assert response.status_code == 200
    assert (response.json()["state"], response.json()["attempts"]) == ("idle", 0)


def test_a_cluster_has_the_default_policy_until_one_is_set(operator_api, fleet_east):
    cluster = fleet_east["cluster"]

    response = operator_api.get(f"/api/clusters/{cluster.pk}/recovery-policy/")

    assert response.json() == {
        "cluster": cluster.pk,
        "cluster_name": "east",
        "auto_power_cycle": False,
        "grace_seconds": 600,
        "max_attempts": 3,
        "boot_timeout_seconds": 900,
    }


def test_a_policy_set_to_what_it_is_writes_nothing(operator_api, fleet_east):
    path = f"/api/clusters/{fleet_east['cluster'].pk}/recovery-policy/"

    assert operator_api.put(path, {}, format="json").status_code == 200
    assert operator_api.put(path, {"grace_seconds": 600}, format="json").status_code == 200

    assert not RecoveryPolicy.objects.exists()
    assert not AuditEvent.objects.filter(verb="bmc.recovery_policy").exists()


def test_an_operator_sets_part_of_a_policy_and_the_rest_keeps_its_value(
    operator_api, fleet_east, operator
):
    cluster = fleet_east["cluster"]

    response = operator_api.put(
        f"/api/clusters/{cluster.pk}/recovery-policy/",
        {"auto_power_cycle": True, "grace_seconds": 120},
        format="json",
    )

    assert response.status_code == 200
    assert response.json()["auto_power_cycle"] is True
    assert (response.json()["grace_seconds"], response.json()["max_attempts"]) == (120, 3)
    event = AuditEvent.objects.get(verb="bmc.recovery_policy")
    assert event.actor == operator
    assert event.after["auto_power_cycle"] is True


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        (
            {"grace_seconds": -1},
            "grace_seconds",
            "Ensure this value is greater than or equal to 0.",
        ),
        ({"max_attempts": 0}, "max_attempts", "Ensure this value is greater than or equal to 1."),
        ({"max_attempts": 21}, "max_attempts", "Ensure this value is less than or equal to 20."),
        ({"boot_timeout_seconds": "soon"}, "boot_timeout_seconds", "A valid integer is required"),
        ({"grace_seconds": "60"}, "grace_seconds", 'must be a whole number, not "60"'),
        ({"boot_timeout_seconds": 0}, "boot_timeout_seconds", "greater than or equal to 1"),
        ({"auto_power_cycle": "yes"}, "auto_power_cycle", "must be true or false"),
        ({"auto": True}, "auto", "cannot be set by this request"),
    ],
)
def test_bad_policy_input_is_a_400_naming_the_field_and_changes_nothing(
    operator_api, fleet_east, body, field, reason
):
    cluster = fleet_east["cluster"]

    response = operator_api.put(
        f"/api/clusters/{cluster.pk}/recovery-policy/",
        {"auto_power_cycle": True, **body},
        format="json",
    )

    assert response.status_code == 400
    error = response.json()["error"]
    assert list(error["fields"]) == [field]
    assert reason in error["fields"][field][0]
    assert not RecoveryPolicy.objects.exists()
    assert not AuditEvent.objects.filter(verb="bmc.recovery_policy").exists()


def test_tenants_and_strangers_are_refused(member_api, anonymous_api, down, fleet_east):
    cluster = fleet_east["cluster"]
    for path, method in (
        (f"/api/nodes/{down.pk}/recovery/", "get"),
        (f"/api/nodes/{down.pk}/power-cycle/", "post"),
        (f"/api/nodes/{down.pk}/recovery/clear/", "post"),
        (f"/api/clusters/{cluster.pk}/recovery-policy/", "get"),
        (f"/api/clusters/{cluster.pk}/recovery-policy/", "put"),
    ):
        assert getattr(member_api, method)(path, {}, format="json").status_code == 403, path
        assert getattr(anonymous_api, method)(path, {}, format="json").status_code == 401, path
    assert not RecoveryAttempt.objects.exists()


def test_an_object_that_does_not_exist_is_a_404(operator_api):
    assert operator_api.post("/api/nodes/999999/power-cycle/").status_code == 404
    assert operator_api.get("/api/clusters/999999/recovery-policy/").status_code == 404
