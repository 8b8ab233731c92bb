"""The VM lifecycle (DESIGN.md section 4) as ``gpucap.rentals.services`` enforces it: every
legal move, every illegal one refused with nothing changed, GPUs and usage released when a VM
stops holding them, an audit event per move, where a stopped VM goes, and driver reports that
arrive twice."""

import threading

import pytest
from django.db import connection
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.rentals import services
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.rentals.services import HOLDING, TRANSITIONS, IllegalTransition
from gpucap.usage.models import UsageInterval

State = VirtualMachine.State
StopReason = VirtualMachine.StopReason

LEGAL = sorted((a, b) for a, targets in TRANSITIONS.items() for b in targets)
ILLEGAL = sorted((a, b) for a in State.values for b in State.values if b not in TRANSITIONS[a])


def events(vm: VirtualMachine, verb: str | None = None):
    found = AuditEvent.objects.filter(object_type="virtualmachine", object_id=str(vm.pk))
    return found.filter(verb=verb) if verb else found


def live_gpus(vm: VirtualMachine) -> list[int]:
    held = Allocation.objects.filter(vm=vm, released_at=None)
    return sorted(held.values_list("gpu__index", flat=True))


def open_usage(vm: VirtualMachine):
    return UsageInterval.objects.filter(vm=vm, ended_at=None)


def snapshot(vm: VirtualMachine) -> dict:
    """Everything a refused move must leave untouched."""
    vm.refresh_from_db()
    return {
        "vm": {f.attname: getattr(vm, f.attname) for f in VirtualMachine._meta.concrete_fields},
        "events": events(vm).count(),
        "allocations": list(Allocation.objects.filter(vm=vm).values_list("gpu_id", "released_at")),
        "usage": list(UsageInterval.objects.filter(vm=vm).values_list("id", "ended_at")),
    }


def test_the_transition_table_is_the_design(db):
    assert set(TRANSITIONS) == set(State.values)
    assert TRANSITIONS[State.TERMINATED] == frozenset(), "terminated is final"
    assert set(HOLDING) == {State.PROVISIONING, State.RUNNING, State.NOTIFIED, State.STOPPING}


@pytest.mark.parametrize(("before", "after"), LEGAL, ids=[f"{a}->{b}" for a, b in LEGAL])
def test_every_legal_move_changes_the_state_and_is_audited(vm_in, fleet_east, before, after):
    vm = vm_in(before)
    extra = {"node": fleet_east["nodes"]["h100-001"]} if vm.node_id is None else {}

    moved = services.vm_transition(vm=vm, to=after, **extra)

    vm.refresh_from_db()
    assert moved.state == vm.state == after
    event = events(vm, f"vm.{after}").latest("id")
    assert event.before["state"] == before
    assert event.after["state"] == after
    assert event.actor is None and event.actor_label == "system"
    if after not in HOLDING:
        assert live_gpus(vm) == []
        assert not open_usage(vm).exists()


@pytest.mark.parametrize(("before", "after"), ILLEGAL, ids=[f"{a}->{b}" for a, b in ILLEGAL])
def test_an_illegal_move_is_refused_and_changes_nothing(vm_in, fleet_east, before, after):
    vm = vm_in(before)
    unchanged = snapshot(vm)

    with pytest.raises(IllegalTransition, match=f"{vm.instance_id} is {before}; it cannot become"):
        services.vm_transition(vm=vm, to=after, node=fleet_east["nodes"]["h100-001"])

    assert snapshot(vm) == unchanged


def test_owner_actions_in_the_wrong_state_are_refused_with_nothing_changed(vm_in, member):
    pending, running, terminated = vm_in("pending"), vm_in("running"), vm_in("terminated")
    before = [snapshot(pending), snapshot(running), snapshot(terminated)]

    with pytest.raises(IllegalTransition, match="is pending; it cannot become stopping"):
        services.vm_stop(vm=pending, actor=member)
    with pytest.raises(IllegalTransition, match="is running; it cannot become pending"):
        services.vm_start(vm=running, actor=member)
    with pytest.raises(IllegalTransition, match="is terminated; it cannot become pending"):
        services.vm_start(vm=terminated, actor=member)

    assert [snapshot(pending), snapshot(running), snapshot(terminated)] == before


def test_placing_takes_the_gpus_and_opens_one_usage_interval(vm_in, tenant):
    vm = vm_in("provisioning", gpus=(4, 5, 6, 7))

    assert vm.state == State.PROVISIONING
    assert vm.node.hostname == "h100-001"
    assert live_gpus(vm) == [4, 5, 6, 7]
    usage = open_usage(vm).get()
    assert (usage.tenant, usage.pool_kind, usage.gpu_model, usage.gpu_count) == (
        tenant,
        "spot",
        "H100-SXM5-80GB",
        4,
    )


def _stop(vm, vm_in):
    return services.vm_mark_stopped(vm=services.vm_stop(vm=vm))


def _fail(vm, vm_in):
    return services.vm_mark_failed(vm=vm, reason="gone")


def _terminate(vm, vm_in):
    return services.vm_mark_stopped(vm=services.vm_terminate(vm=vm))


def _preempt(vm, vm_in):
    winner = vm_in("pending", pool="h100-ondemand")
    return services.vm_mark_stopped(vm=services.vm_preempt(vm=vm, for_vm=winner))


@pytest.mark.parametrize("leave", [_stop, _fail, _terminate, _preempt])
def test_a_vm_that_stops_holding_gpus_releases_them_and_closes_its_usage(vm_in, leave):
    vm = vm_in("running", gpus=(0, 1))
    assert live_gpus(vm) == [0, 1]

    left = leave(vm, vm_in)

    assert left.state not in HOLDING
    assert live_gpus(vm) == []
    usage = UsageInterval.objects.get(vm=vm)
    assert usage.ended_at is not None and usage.ended_at >= usage.started_at
    # The cards are free again: another VM can be placed on them.
    other = vm_in("provisioning", gpus=(0, 1))
    assert live_gpus(other) == [0, 1]


def test_gpus_stay_held_while_a_vm_is_notified_or_stopping(vm_in):
    notified = vm_in("notified", gpus=(0,))
    stopping = vm_in("stopping", gpus=(1,))

    assert live_gpus(notified) == [0] and open_usage(notified).count() == 1
    assert live_gpus(stopping) == [1] and open_usage(stopping).count() == 1


def test_the_audit_event_names_actor_verb_and_before_after(vm_in, member):
    vm = vm_in("running")

    services.vm_stop(vm=vm, actor=member)

    event = events(vm, "vm.stopping").get()
    assert (event.actor, event.actor_label) == (member, "mallory")
    assert event.object_label.startswith(vm.instance_id)
    assert event.before == {"state": "running", "stop_reason": ""}
    assert event.after == {"state": "stopping", "stop_reason": "owner"}
    assert event.created_at <= timezone.now()


def test_every_move_of_a_vm_leaves_one_audit_event(vm_in):
    vm = vm_in("stopped")

    verbs = list(events(vm).order_by("id").values_list("verb", flat=True))

    assert verbs == [
        "vm.request",
        "vm.provisioning",
        "vm.running",
        "vm.stopping",
        "vm.stopped",
    ]


def test_owner_stop_ends_stopped_and_start_asks_for_capacity_again(
    vm_in, sent_tasks, django_capture_on_commit_callbacks
):
    vm = vm_in("running", pool="a100-standalone", node="a100-001")
    first_request = vm.requested_at

    with django_capture_on_commit_callbacks(execute=True):
        stopping = services.vm_stop(vm=vm)
    assert (stopping.state, stopping.stop_reason) == (State.STOPPING, StopReason.OWNER)
    assert sent_tasks == [("rentals.vm_stop", [vm.pk])]

    stopped = services.vm_mark_stopped(vm=vm)
    assert stopped.state == State.STOPPED
    assert stopped.stop_reason == ""

    sent_tasks.clear()
    with django_capture_on_commit_callbacks(execute=True):
        started = services.vm_start(vm=vm)
    assert started.state == State.PENDING
    assert started.requested_at > first_request, "a restarted VM queues from now"
    assert sent_tasks == [("rentals.standalone_place", [vm.pool.cluster_id])]


def test_a_preempted_spot_vm_goes_back_to_pending_and_waits_for_capacity(vm_in):
    victim = vm_in("running", pool="h100-spot")
    winner = vm_in("pending", pool="h100-ondemand")
    asked_at = victim.requested_at

    stopping = services.vm_preempt(vm=victim, for_vm=winner)
    assert (stopping.state, stopping.stop_reason) == (State.STOPPING, StopReason.PREEMPTED)
    assert stopping.preempted_for == winner
    assert "preempted without notice" in events(victim, "vm.stopping").get().message

    resumed = services.vm_mark_stopped(vm=victim)
    assert resumed.state == State.PENDING
    assert resumed.requested_at > asked_at
    assert (resumed.stop_reason, resumed.preempted_for) == ("", None)
    assert live_gpus(victim) == []
    assert "resumes when capacity returns" in events(victim, "vm.pending").get().message


@pytest.mark.parametrize(
    ("pool", "ends"),
    [("h100-spot", State.PENDING), ("h100-ondemand", State.STOPPED)],
)
def test_a_reclaimed_vm_waits_again_if_spot_and_stops_otherwise(vm_in, pool, ends):
    vm = vm_in("notified", pool=pool)
    services.vm_transition(vm=vm, to=State.STOPPING, stop_reason=StopReason.RECLAIMED)

    assert services.vm_mark_stopped(vm=vm).state == ends


def test_terminating_a_pending_vm_ends_it_with_nothing_to_destroy(
    vm_in, sent_tasks, django_capture_on_commit_callbacks
):
    vm = vm_in("pending")
    sent_tasks.clear()

    with django_capture_on_commit_callbacks(execute=True):
        done = services.vm_terminate(vm=vm)

    assert done.state == State.TERMINATED
    assert sent_tasks == [], "a VM never placed has nothing on a hypervisor"


@pytest.mark.parametrize("state", [State.STOPPED, State.FAILED])
def test_terminating_a_vm_that_was_placed_destroys_it_on_its_node(
    vm_in, sent_tasks, django_capture_on_commit_callbacks, state
):
    vm = vm_in(state)

    with django_capture_on_commit_callbacks(execute=True):
        done = services.vm_terminate(vm=vm)

    assert done.state == State.TERMINATED
    assert sent_tasks == [("rentals.vm_destroy", [vm.pk])]


def test_terminating_a_running_spot_vm_stops_then_destroys_it_and_it_never_waits_again(
    vm_in, sent_tasks, django_capture_on_commit_callbacks
):
    vm = vm_in("running", pool="h100-spot")

    with django_capture_on_commit_callbacks(execute=True):
        stopping = services.vm_terminate(vm=vm)
    assert (stopping.state, stopping.stop_reason) == (State.STOPPING, StopReason.TERMINATE)
    assert sent_tasks == [("rentals.vm_stop", [vm.pk])]

    with django_capture_on_commit_callbacks(execute=True):
        done = services.vm_mark_stopped(vm=vm)
    assert done.state == State.TERMINATED
    assert sent_tasks[-1] == ("rentals.vm_destroy", [vm.pk])
    assert live_gpus(vm) == []


def test_terminating_a_vm_already_stopping_turns_the_stop_into_a_terminate(vm_in):
    vm = vm_in("stopping")  # stopped by its owner
    services.vm_terminate(vm=vm)

    assert services.vm_mark_stopped(vm=vm).state == State.TERMINATED
    assert events(vm, "vm.terminate").get().message == "terminate once stopped"


def test_terminating_twice_is_harmless(vm_in):
    vm = vm_in("stopped")
    services.vm_terminate(vm=vm)
    again = snapshot(vm)

    assert services.vm_terminate(vm=vm).state == State.TERMINATED
    assert snapshot(vm) == again
    assert events(vm, "vm.terminated").count() == 1


def test_driver_reports_that_arrive_twice_change_nothing_the_second_time(vm_in):
    vm = vm_in("provisioning")

    services.vm_mark_running(vm=vm, ip_address="10.200.0.7")
    once = snapshot(vm)
    services.vm_mark_running(vm=vm, ip_address="10.200.0.99")
    assert snapshot(vm) == once
    assert vm.ip_address == "10.200.0.7"

    services.vm_stop(vm=vm)
    services.vm_mark_stopped(vm=vm)
    once = snapshot(vm)
    services.vm_mark_stopped(vm=vm)
    assert snapshot(vm) == once

    failed = vm_in("failed")
    once = snapshot(failed)
    services.vm_mark_failed(vm=failed, reason="a second, different reason")
    assert snapshot(failed) == once
    assert failed.failure_reason == "the hypervisor caught fire"


@pytest.mark.parametrize("state", [State.STOPPING, State.FAILED, State.TERMINATED])
def test_a_late_boot_report_does_not_revive_a_vm(vm_in, state):
    vm = vm_in(state)
    before = snapshot(vm)

    assert services.vm_mark_running(vm=vm, ip_address="10.200.0.7").state == state
    assert snapshot(vm) == before


def test_a_failure_report_keeps_the_drivers_message_and_frees_the_gpus(vm_in):
    vm = vm_in("running", gpus=(2, 3))

    failed = services.vm_mark_failed(vm=vm, reason="PCI device 0000:3a:00.0 fell off the bus")

    assert failed.state == State.FAILED
    assert failed.failure_reason == "PCI device 0000:3a:00.0 fell off the bus"
    assert events(vm, "vm.failed").get().message == "PCI device 0000:3a:00.0 fell off the bus"
    assert live_gpus(vm) == []


def test_tasks_are_sent_only_when_the_transaction_commits(
    vm_in, fleet_east, sent_tasks, django_capture_on_commit_callbacks
):
    vm = vm_in("pending")

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        services.vm_place(vm=vm, node=fleet_east["nodes"]["h100-001"], gpu_indices=[0])
        assert sent_tasks == [], "nothing leaves before the commit"
    for callback in callbacks:
        callback()

    assert sent_tasks == [("rentals.vm_provision", [vm.pk])]


# --- reports racing on separate connections -----------------------------------------------------


def _race(*calls) -> list[BaseException]:
    """Run ``calls`` at once, each in a thread with its own database connection."""
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def run(call) -> None:
        try:
            barrier.wait(timeout=10)
            call()
        except BaseException as error:  # reported to the test, not lost in the thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return errors


@pytest.mark.django_db(transaction=True)
def test_two_workers_reporting_a_boot_at_once_make_one_running_vm(vm_in, sent_tasks):
    vm = vm_in("provisioning", gpus=(0, 1))

    errors = _race(
        *[lambda: services.vm_mark_running(vm=vm, ip_address="10.200.0.7") for _ in range(6)]
    )

    assert errors == []
    vm.refresh_from_db()
    assert vm.state == State.RUNNING
    assert events(vm, "vm.running").count() == 1
    assert open_usage(vm).count() == 1
    assert live_gpus(vm) == [0, 1]


@pytest.mark.django_db(transaction=True)
def test_a_stop_report_racing_a_failure_report_ends_in_exactly_one_of_them(vm_in, sent_tasks):
    vm = vm_in("stopping", gpus=(0,))

    errors = _race(
        lambda: services.vm_mark_stopped(vm=vm),
        lambda: services.vm_mark_failed(vm=vm, reason="lost"),
    )

    assert errors == []
    vm.refresh_from_db()
    assert vm.state in (State.STOPPED, State.FAILED)
    assert events(vm).filter(verb__in=["vm.stopped", "vm.failed"]).count() == 1
    assert live_gpus(vm) == []
    assert UsageInterval.objects.filter(vm=vm).count() == 1
    assert not open_usage(vm).exists()
