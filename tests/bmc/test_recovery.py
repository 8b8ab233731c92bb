"""Recovery by power cycle (docs/bmc.md, Recovery) against sushy-emulator's fake system (its power
really goes Off and On, 1 to 11 s after each reset) with the simulated fleet's hypervisor
silent or answering: an operator's Power-cycle and the automatic one after the grace bring a
down node back to ready once its hypervisor answers; a BMC that refuses is reported at once
and never tried again; one that cannot be reached is tried again with backoff, then recovery
stops after max_attempts, and the operators' attention strip says so; a hypervisor that stays
silent past the boot timeout counts as a failure; a cycle whose worker was lost fails at its
deadline. The tick's time is passed in; the power cycle runs inline, as its task would."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.bmc import recovery
from gpucap.bmc.power_cycle import power_cycle_carry_out, recovery_tick
from gpucap.bmc.recovery_models import NodeRecovery, RecoveryAttempt
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from tests.bmc.emulators import free_port
from tests.bmc.recovery_helpers import (
    attempts_of,
    give_bmc,
    power_becomes,
    recovery_of,
    state_of,
)

State = NodeRecovery.State


@pytest.fixture
def fast(settings):
    settings.RECOVERY_POLL_SECONDS = 0.2
    settings.RECOVERY_BACKOFF_SECONDS = 60


@pytest.fixture
def machine(dynamic_bmc):
    """The emulated machine, switched on (a test before may have left it on its way)."""
    power_becomes(dynamic_bmc.url, "on")
    return dynamic_bmc


@pytest.fixture
def down_node(fleet_east, sim, machine, operator, fast, sent_tasks):
    """h100-001, its BMC the emulated machine, its hypervisor silent, marked down."""
    node = give_bmc(fleet_east["nodes"]["h100-001"], machine.url)
    sim.hypervisor_silence("h100-001")
    return fleet.node_set_state(node=node, state="down", actor=operator, message="hung")


def automatic(cluster, **policy) -> None:
    recovery.recovery_policy_set(cluster=cluster, actor=None, auto_power_cycle=True, **policy)


def test_an_operator_power_cycles_a_down_node_and_it_is_ready_once_its_hypervisor_answers(
    down_node, machine, sim, operator
):
    attempt = recovery.power_cycle_request(node=down_node, actor=operator)

    assert recovery_of(down_node).state == State.CYCLING
    assert (attempt.trigger, attempt.actor) == ("operator", operator)
    event = AuditEvent.objects.get(verb="bmc.power_cycle", object_id=str(down_node.pk))
    assert event.actor == operator

    assert power_cycle_carry_out(attempt_id=attempt.pk) is True

    assert recovery_of(down_node).state == State.WAITING
    attempt.refresh_from_db()
    assert attempt.message.startswith("power Off at ")  # it went off, then On was asked
    assert attempt.powered_on_at is not None
    power_becomes(machine.url, "on")
    assert recovery_tick()["recovered"] == []  # the hypervisor is still booting
    assert state_of(down_node) == "down"

    sim.hypervisor_restore("h100-001")  # it booted
    assert recovery_tick()["recovered"] == [down_node.pk]

    assert state_of(down_node) == "ready"
    row = recovery_of(down_node)
    assert (row.state, row.attempts, row.last_error) == (State.IDLE, 0, "")
    [done] = attempts_of(down_node)
    assert done.outcome == RecoveryAttempt.Outcome.RECOVERED
    assert "its hypervisor answered" in done.message
    recovered = AuditEvent.objects.get(verb="node.recover", object_id=str(down_node.pk))
    assert recovered.message.startswith("recovered by a power cycle: its hypervisor answered")


def test_the_tick_power_cycles_a_down_node_itself_once_the_grace_has_passed(
    down_node, machine, sim, fleet_east
):
    down_since = recovery_of(down_node).down_since
    assert recovery_tick(now=down_since + timedelta(days=1))["started"] == []  # policy: off

    automatic(fleet_east["cluster"], grace_seconds=600)
    assert recovery_tick(now=down_since + timedelta(seconds=599))["started"] == []
    assert recovery_tick(now=down_since + timedelta(seconds=600))["started"] == [down_node.pk]

    [attempt] = attempts_of(down_node)
    assert (attempt.trigger, attempt.actor) == ("automatic", None)
    assert power_cycle_carry_out(attempt_id=attempt.pk) is True
    assert power_cycle_carry_out(attempt_id=attempt.pk) is False  # delivered twice: once only
    sim.hypervisor_restore("h100-001")
    recovery_tick()
    assert state_of(down_node) == "ready"


@pytest.mark.parametrize("bmc", ["refusing", "wrong_password"])
def test_a_bmc_that_refuses_is_reported_at_once_and_never_tried_again(
    bmc, down_node, machine, refusing_bmc, fleet_east, operator_client
):
    if bmc == "refusing":
        give_bmc(down_node, refusing_bmc.url)
    else:
        give_bmc(down_node, machine.url, password="not-the-password")
    automatic(fleet_east["cluster"], grace_seconds=0, max_attempts=3)

    recovery_tick()
    [attempt] = attempts_of(down_node)
    assert power_cycle_carry_out(attempt_id=attempt.pk) is False

    row = recovery_of(down_node)
    assert (row.state, row.attempts) == (State.STOPPED, 1)
    assert "refused the user name or password (HTTP 401)" in row.last_error
    attempt.refresh_from_db()
    assert attempt.outcome == RecoveryAttempt.Outcome.REFUSED
    stop = AuditEvent.objects.get(verb="bmc.recovery_stop", object_id=str(down_node.pk))
    assert stop.message.startswith("recovery stopped (the BMC refused) until an operator clears")
    strip = " ".join(operator_client.get("/").content.decode().split())
    assert (
        'recovery stopped: <a href="/fleet/nodes/east/h100-001/">h100-001</a>, '
        '<span class="small">1 power cycle failed:</span>'
    ) in strip
    # Automation leaves it alone from now on, however long it stays down.
    later = timezone.now() + timedelta(days=2)
    assert recovery_tick(now=later) == {"started": [], "recovered": [], "failed": []}
    assert len(attempts_of(down_node)) == 1


def test_an_unreachable_bmc_is_tried_again_with_backoff_then_recovery_stops(
    down_node, fleet_east, operator_client
):
    give_bmc(down_node, f"http://127.0.0.1:{free_port()}")
    automatic(fleet_east["cluster"], grace_seconds=0, max_attempts=2)

    recovery_tick()
    power_cycle_carry_out(attempt_id=attempts_of(down_node)[-1].pk)
    row = recovery_of(down_node)
    assert (row.state, row.attempts) == (State.IDLE, 1)
    assert "no answer from the BMC" in row.last_error
    assert row.next_attempt_at > timezone.now() + timedelta(seconds=50)  # backoff: 60 s
    assert recovery_tick()["started"] == []  # not before the backoff

    recovery_tick(now=row.next_attempt_at)
    power_cycle_carry_out(attempt_id=attempts_of(down_node)[-1].pk)

    row = recovery_of(down_node)
    assert (row.state, row.attempts) == (State.STOPPED, 2)
    assert [a.outcome for a in attempts_of(down_node)] == ["failed", "failed"]
    strip = " ".join(operator_client.get("/").content.decode().split())
    assert 'h100-001</a>, <span class="small">2 power cycles failed:</span>' in strip
    assert "no answer from the BMC" in strip
    assert recovery_tick(now=timezone.now() + timedelta(days=1))["started"] == []


def test_a_hypervisor_silent_past_the_boot_timeout_fails_the_cycle(down_node, fleet_east):
    automatic(fleet_east["cluster"], grace_seconds=0, boot_timeout_seconds=30)
    recovery_tick()
    [attempt] = attempts_of(down_node)
    power_cycle_carry_out(attempt_id=attempt.pk)
    deadline = recovery_of(down_node).deadline

    assert recovery_tick(now=deadline - timedelta(seconds=1))["failed"] == []
    assert recovery_tick(now=deadline)["failed"] == [down_node.pk]

    row = recovery_of(down_node)
    assert (row.state, row.attempts) == (State.IDLE, 1)
    assert row.last_error == "node h100-001: its hypervisor did not answer within 30 s of power on"
    assert state_of(down_node) == "down"


def test_a_cycle_whose_worker_was_lost_fails_at_its_deadline_and_is_never_run_late(
    down_node, operator, monkeypatch
):
    attempt = recovery.power_cycle_request(node=down_node, actor=operator)
    deadline = recovery_of(down_node).deadline

    assert recovery_tick(now=deadline)["failed"] == [down_node.pk]
    assert "did not finish by" in recovery_of(down_node).last_error

    resets = []
    monkeypatch.setattr(
        "gpucap.bmc.power_cycle.system_reset", lambda target, reset: resets.append(reset)
    )
    assert power_cycle_carry_out(attempt_id=attempt.pk) is False  # the lost task, delivered
    assert resets == []


def test_an_operator_may_not_power_cycle_a_node_that_is_up_has_no_bmc_or_is_cycling(
    fleet_east, down_node, operator, sent_tasks, django_capture_on_commit_callbacks
):
    with pytest.raises(Conflict) as up:
        recovery.power_cycle_request(node=fleet_east["nodes"]["h100-002"], actor=operator)
    assert up.value.code == "node_not_down"

    bare = fleet.node_set_state(node=fleet_east["nodes"]["l40s-001"], state="down")
    with pytest.raises(Conflict) as no_bmc:
        recovery.power_cycle_request(node=bare, actor=operator)
    assert no_bmc.value.code == "no_bmc"
    assert no_bmc.value.message == (
        "node l40s-001 has no BMC address: set its BMC before power-cycling it"
    )

    with django_capture_on_commit_callbacks(execute=True):
        recovery.power_cycle_request(node=down_node, actor=operator)
    with pytest.raises(Conflict) as busy, django_capture_on_commit_callbacks(execute=True):
        recovery.power_cycle_request(node=down_node, actor=operator)
    assert busy.value.code == "cycle_running"
    assert len(attempts_of(down_node)) == 1
    assert [name for name, _ in sent_tasks] == ["bmc.power_cycle"]


def test_an_operator_clears_a_stopped_recovery_and_may_cycle_whatever_the_policy(
    down_node, operator
):
    give_bmc(down_node, f"http://127.0.0.1:{free_port()}", password="x")
    NodeRecovery.objects.filter(node=down_node).update(
        state=State.STOPPED, attempts=3, last_error="no answer"
    )
    attempt = recovery.power_cycle_request(node=down_node, actor=operator)  # allowed: stopped
    power_cycle_carry_out(attempt_id=attempt.pk)
    assert (recovery_of(down_node).state, recovery_of(down_node).attempts) == (State.STOPPED, 4)

    recovery.recovery_clear(node=down_node, actor=operator)

    row = recovery_of(down_node)
    assert (row.state, row.attempts, row.last_error) == (State.IDLE, 0, "")
    event = AuditEvent.objects.get(verb="bmc.recovery_clear")
    assert event.actor == operator
    with pytest.raises(Conflict, match="is not stopped: nothing to clear"):
        recovery.recovery_clear(node=down_node, actor=operator)


def test_a_node_going_down_starts_its_grace(fleet_east, operator):
    node = fleet.node_set_state(node=fleet_east["nodes"]["a100-001"], state="down")

    assert recovery_of(node).down_since is not None
    assert recovery_of(node).state == State.IDLE


def test_a_policy_with_bad_values_names_each_field_and_changes_nothing(fleet_east):
    cluster = fleet_east["cluster"]
    with pytest.raises(Exception) as caught:
        recovery.recovery_policy_set(
            cluster=cluster,
            actor=None,
            grace_seconds=-1,
            max_attempts=0,
            boot_timeout_seconds="soon",
            auto_power_cycle="yes",
        )
    assert caught.value.message_dict == {
        "grace_seconds": ["must be between 0 and 604800, got -1"],
        "max_attempts": ["must be between 1 and 20, got 0"],
        "boot_timeout_seconds": ["must be a whole number"],
        "auto_power_cycle": ["must be true or false"],
    }
    assert recovery.policy_of(cluster).pk is None
    assert not AuditEvent.objects.filter(verb="bmc.recovery_policy").exists()

    recovery.recovery_policy_set(cluster=cluster, actor=None, grace_seconds=60)
    recovery.recovery_policy_set(cluster=cluster, actor=None, grace_seconds=60)  # the same
    assert AuditEvent.objects.filter(verb="bmc.recovery_policy").count() == 1
    policy = recovery.policy_of(cluster)
    assert (policy.auto_power_cycle, policy.grace_seconds, policy.max_attempts) == (False, 60, 3)
