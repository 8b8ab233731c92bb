"""The hypervisor watch (docs/bmc.md, Recovery, "Down") over the simulated fleet: a node whose
hypervisor stays silent for NODE_DOWN_AFTER_SECONDS is marked down, audited with no actor and
"hypervisor unreachable since …", and its VMs go as a down node's do; one that answers again in
time is not marked; probes run in parallel, a bounded number at a time; the fleet's
``node_recovered`` is recovery's own way back to ready. Time is passed in (``now``), except in
the last test, where a real beat and worker run the watch."""

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.bmc.hypervisor_watch import hypervisor_watch
from gpucap.bmc.models import HypervisorProbe
from gpucap.drivers.simulated import SimulatedDriver
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node
from gpucap.rentals.models import VirtualMachine
from tests.rentals.conftest import wait_for

State = VirtualMachine.State


def state_of(node: Node) -> str:
    return Node.objects.values_list("state", flat=True).get(pk=node.pk)


def marked(node: Node) -> list[AuditEvent]:
    return list(
        AuditEvent.objects.filter(object_type="node", object_id=str(node.pk), verb="node.mark_down")
    )


@pytest.fixture
def east(fleet_east, sim, settings):
    settings.NODE_DOWN_AFTER_SECONDS = 300
    return fleet_east["nodes"]


def test_hypervisors_that_answer_leave_every_node_as_it_is(east):
    at = timezone.now()

    assert hypervisor_watch(now=at) == []

    assert {node.state for node in Node.objects.all()} == {"ready"}
    probe = HypervisorProbe.objects.get(node=east["h100-001"])
    assert (probe.probed_at, probe.answered_at, probe.silent_since) == (at, at, None)


def test_a_node_silent_for_the_whole_threshold_is_marked_down_with_its_vms(east, sim, vm_in):
    spot = vm_in("running", pool="h100-spot", gpus=(0,))
    on_demand = vm_in("running", pool="h100-ondemand", gpus=(1,))
    sim.hypervisor_silence("h100-001")
    t0 = timezone.now()

    assert hypervisor_watch(now=t0) == []
    assert hypervisor_watch(now=t0 + timedelta(seconds=299)) == []
    assert state_of(east["h100-001"]) == "ready"

    assert hypervisor_watch(now=t0 + timedelta(seconds=300)) == [east["h100-001"]]

    assert state_of(east["h100-001"]) == "down"
    [event] = marked(east["h100-001"])
    assert event.actor is None and event.actor_label == "system"
    assert event.message == f"hypervisor unreachable since {t0:%Y-%m-%d %H:%M:%S} UTC"
    assert (event.before, event.after) == ({"state": "ready"}, {"state": "down"})
    # What marking a node down always does: the spot VM waits to resume, the other fails.
    assert VirtualMachine.objects.get(pk=spot.pk).state == State.PENDING
    assert VirtualMachine.objects.get(pk=on_demand.pk).state == State.FAILED
    # The other nodes answered all along.
    assert Node.objects.filter(state="down").count() == 1


def test_a_node_that_answers_again_in_time_is_not_marked(east, sim):
    sim.hypervisor_silence("h100-002")
    t0 = timezone.now()
    hypervisor_watch(now=t0)
    sim.hypervisor_restore("h100-002")
    hypervisor_watch(now=t0 + timedelta(seconds=200))
    sim.hypervisor_silence("h100-002")

    # Silent again from 250 s: the silence counts from there, not from t0.
    assert hypervisor_watch(now=t0 + timedelta(seconds=250)) == []
    assert hypervisor_watch(now=t0 + timedelta(seconds=400)) == []
    assert state_of(east["h100-002"]) == "ready"
    assert hypervisor_watch(now=t0 + timedelta(seconds=550)) == [east["h100-002"]]


def test_a_late_round_never_marks_a_node_an_answer_since_cleared(east, sim):
    sim.hypervisor_silence("l40s-001")
    t0 = timezone.now()
    hypervisor_watch(now=t0)
    sim.hypervisor_restore("l40s-001")
    hypervisor_watch(now=t0 + timedelta(seconds=310))  # answered
    sim.hypervisor_silence("l40s-001")

    # A round sent before that answer, recorded after it (a slow worker), is out of date.
    assert hypervisor_watch(now=t0 + timedelta(seconds=305)) == []
    assert state_of(east["l40s-001"]) == "ready"
    assert HypervisorProbe.objects.get(node=east["l40s-001"]).silent_since is None


def test_a_down_node_is_not_watched_and_starts_afresh_when_it_is_back(east, sim, operator):
    sim.hypervisor_silence("a100-001")
    t0 = timezone.now()
    hypervisor_watch(now=t0)
    fleet.node_set_state(node=east["a100-001"], state="down", actor=operator)

    hypervisor_watch(now=t0 + timedelta(seconds=600))
    assert len(marked(east["a100-001"])) == 1  # the operator's; the watch left it alone
    assert HypervisorProbe.objects.get(node=east["a100-001"]).silent_since is None

    fleet.node_set_state(node=east["a100-001"], state="cordoned", actor=operator)
    assert hypervisor_watch(now=t0 + timedelta(seconds=700)) == []  # silent from 700 s only
    assert state_of(east["a100-001"]) == "cordoned"


def test_probes_run_in_parallel_a_bounded_number_at_a_time(east, settings, monkeypatch):
    settings.HYPERVISOR_PROBE_CONCURRENCY = 2
    lock, in_flight, most = threading.Lock(), [0], [0]
    both = threading.Barrier(2, timeout=30)  # the first two probes meet: they are in parallel
    met = []
    answers = SimulatedDriver.hypervisor_answers

    def slow_answer(driver, node):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        if not met:
            both.wait()
            met.append(node)
        try:
            return answers(driver, node)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(SimulatedDriver, "hypervisor_answers", slow_answer)

    assert hypervisor_watch() == []

    assert most[0] == 2
    assert HypervisorProbe.objects.count() == Node.objects.count() == 5


def test_nodes_of_a_cluster_whose_driver_cannot_be_built_are_not_judged(east, sim):
    Cluster.objects.filter(name="east").update(driver_settings={"no_such_setting": 1})
    sim.hypervisor_silence("h100-001")
    t0 = timezone.now()

    assert hypervisor_watch(now=t0) == []
    assert hypervisor_watch(now=t0 + timedelta(seconds=900)) == []
    assert state_of(east["h100-001"]) == "ready"
    assert not HypervisorProbe.objects.exists()


# --- the way back: node_recovered ------------------------------------------------------------


def test_recovery_brings_a_down_node_back_to_ready_audited(east, operator):
    node = fleet.node_set_state(node=east["h100-001"], state="down", actor=operator)

    fleet.node_recovered(node=node, message="its hypervisor answered after a power cycle")

    assert state_of(node) == "ready"
    event = AuditEvent.objects.filter(object_id=str(node.pk), verb="node.recover").get()
    assert (event.actor, event.before, event.after) == (None, {"state": "down"}, {"state": "ready"})
    assert event.message == "its hypervisor answered after a power cycle"


def test_recovery_leaves_a_node_that_is_not_down_as_it_is(east, operator):
    node = fleet.node_cordon(node=east["h100-002"], actor=operator)

    assert fleet.node_recovered(node=node).state == "cordoned"
    assert not AuditEvent.objects.filter(verb="node.recover").exists()


def test_an_operator_still_brings_a_down_node_back_cordoned_only(east, operator):
    node = fleet.node_set_state(node=east["l40s-002"], state="down", actor=operator)

    with pytest.raises(Conflict, match="it cannot become ready"):
        fleet.node_set_state(node=node, state="ready", actor=operator)


# --- the beat and a worker ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_beat_marks_a_silent_node_down_through_a_real_worker(fleet_east, sim, workers):
    env = {"HYPERVISOR_WATCH_SECONDS": "1", "NODE_DOWN_AFTER_SECONDS": "3"}
    worker = workers(**env)
    workers(beat=True, **env)
    node = fleet_east["nodes"]["l40s-002"]
    wait_for(
        lambda: HypervisorProbe.objects.filter(node=node, answered_at__isnull=False).exists(),
        timeout=60,
        what="the first round of probes",
        log=worker.log,
    )

    sim.hypervisor_silence("l40s-002")

    wait_for(lambda: state_of(node) == "down", timeout=60, what="l40s-002 down", log=worker.log)
    [event] = marked(node)
    assert event.message.startswith("hypervisor unreachable since ")
    assert set(Node.objects.exclude(pk=node.pk).values_list("state", flat=True)) == {"ready"}
