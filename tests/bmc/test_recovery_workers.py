"""Recovery with more than one worker: two ticks racing start one power cycle, and the cycle's
task delivered twice at once resets the machine once; then the whole story through a real beat
and worker — a node's hypervisor falls silent, the watch marks it down, the automatic power
cycle switches sushy-emulator's fake system off and on, and the node is ready once its
hypervisor answers again."""

import threading

import pytest
from django.db import connection

from gpucap.audit.models import AuditEvent
from gpucap.bmc import power_cycle, recovery
from gpucap.bmc.models import HypervisorProbe
from gpucap.bmc.recovery_models import NodeRecovery, RecoveryAttempt
from gpucap.celery import app
from gpucap.fleet import services as fleet
from tests.bmc.conftest import TEST_KEY
from tests.bmc.recovery_helpers import attempts_of, give_bmc, power_becomes, recovery_of, state_of
from tests.rentals.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def in_threads(work, count: int = 2) -> list:
    """Run ``work`` in ``count`` threads at once, each on its own database connection; what
    each returned (or raised)."""
    results: list = [None] * count

    def run(index: int) -> None:
        try:
            results[index] = work()
        except Exception as error:  # reported by the caller's asserts
            results[index] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def test_two_ticks_racing_start_one_cycle_and_two_deliveries_reset_the_machine_once(
    fleet_east, dynamic_bmc, sim, settings, monkeypatch
):
    settings.RECOVERY_POLL_SECONDS = 0.2
    power_becomes(dynamic_bmc.url, "on")
    node = give_bmc(fleet_east["nodes"]["h100-001"], dynamic_bmc.url)
    fleet.node_set_state(node=node, state="down")
    recovery.recovery_policy_set(
        cluster=fleet_east["cluster"], actor=None, auto_power_cycle=True, grace_seconds=0
    )
    sent = []
    monkeypatch.setattr(app, "send_task", lambda name, args=None, **kw: sent.append((name, args)))
    # Both ticks find the node due before either starts its cycle.
    both_read = threading.Barrier(2, timeout=30)
    due = power_cycle._due_for_a_cycle

    def due_then_wait(now):
        found = due(now)
        both_read.wait()
        return found

    monkeypatch.setattr(power_cycle, "_due_for_a_cycle", due_then_wait)

    ticks = in_threads(power_cycle.recovery_tick)

    assert sorted(len(tick["started"]) for tick in ticks) == [0, 1], ticks
    [attempt] = attempts_of(node)
    assert sent == [("bmc.power_cycle", [attempt.pk])]
    assert AuditEvent.objects.filter(verb="bmc.power_cycle").count() == 1

    resets = []
    reset = power_cycle.system_reset
    monkeypatch.setattr(
        power_cycle, "system_reset", lambda target, kind: (resets.append(kind), reset(target, kind))
    )
    both_deliver = threading.Barrier(2, timeout=30)

    def deliver():
        both_deliver.wait()
        return power_cycle.power_cycle_carry_out(attempt_id=attempt.pk)

    assert sorted(in_threads(deliver)) == [False, True]
    assert resets == ["force_off", "on"]
    assert recovery_of(node).state == NodeRecovery.State.WAITING


def test_a_silent_node_is_marked_down_power_cycled_and_ready_again_through_real_workers(
    fleet_east, dynamic_bmc, sim, workers
):
    power_becomes(dynamic_bmc.url, "on")
    node = give_bmc(fleet_east["nodes"]["h100-002"], dynamic_bmc.url)
    recovery.recovery_policy_set(
        cluster=fleet_east["cluster"],
        actor=None,
        auto_power_cycle=True,
        grace_seconds=0,
        boot_timeout_seconds=300,
    )
    env = {
        "BMC_CREDENTIAL_KEYS": TEST_KEY,
        "HYPERVISOR_WATCH_SECONDS": "1",
        "NODE_DOWN_AFTER_SECONDS": "2",
        "RECOVERY_TICK_SECONDS": "1",
        "RECOVERY_POLL_SECONDS": "1",
    }
    worker = workers(**env)
    workers(beat=True, **env)
    wait_for(
        lambda: HypervisorProbe.objects.filter(node=node, answered_at__isnull=False).exists(),
        timeout=60,
        what="the first round of probes",
        log=worker.log,
    )

    sim.hypervisor_silence("h100-002")  # the machine hangs

    wait_for(
        lambda: NodeRecovery.objects.filter(node=node, state="waiting").exists(),
        timeout=120,
        what="marked down, power-cycled, waiting for its hypervisor",
        log=worker.log,
    )
    assert state_of(node) == "down"
    power_becomes(dynamic_bmc.url, "on")
    sim.hypervisor_restore("h100-002")  # it booted

    wait_for(lambda: state_of(node) == "ready", timeout=60, what="ready", log=worker.log)
    [attempt] = attempts_of(node)
    assert (attempt.trigger, attempt.outcome) == ("automatic", RecoveryAttempt.Outcome.RECOVERED)
    assert attempt.message.startswith("its hypervisor answered")
    verbs = list(
        AuditEvent.objects.filter(object_type="node", object_id=str(node.pk))
        .order_by("id")
        .values_list("verb", flat=True)
    )
    assert verbs[-3:] == ["node.mark_down", "bmc.power_cycle", "node.recover"]
