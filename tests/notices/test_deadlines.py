"""Deadlines that hold (DESIGN.md section 4): a notified VM is stopped at its deadline, never
before; a duplicate or early stop task changes nothing; with the scheduled task lost the sweep
still stops it; a spot VM keeps its disk and resumes; a guest that is done frees its GPUs early."""

import threading
from datetime import timedelta

import pytest
from django.db import connection

from gpucap.audit.models import AuditEvent
from gpucap.drivers.base import VmSpec
from gpucap.errors import Conflict
from gpucap.notices import services, tasks
from gpucap.notices.models import InterruptionNotice
from gpucap.rentals import services as rentals
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.rentals.reconcile import vms_reconcile

State = VirtualMachine.State
Reason = InterruptionNotice.Reason
Outcome = InterruptionNotice.Outcome


def events(vm: VirtualMachine, verb: str) -> int:
    return AuditEvent.objects.filter(object_id=str(vm.pk), verb=verb).count()


def live_gpus(vm: VirtualMachine) -> int:
    return Allocation.objects.filter(vm=vm, released_at=None).count()


def state_of(vm: VirtualMachine) -> str:
    return VirtualMachine.objects.get(pk=vm.pk).state


@pytest.fixture
def notified(vm_in):
    """A running spot VM of the H100 set with an arbiter notice (deadline in 120 s)."""
    vm = vm_in("running")
    return vm, services.notice_issue(vm=vm, reason=Reason.ARBITER)


def test_the_vm_is_stopped_at_the_deadline_and_not_a_moment_before(notified):
    vm, notice = notified
    assert notice.deadline - notice.issued_at == timedelta(seconds=120)  # the set's default
    assert state_of(vm) == State.NOTIFIED

    early = notice.deadline - timedelta(milliseconds=1)
    assert services.notice_deadline_reached(notice=notice, now=early) is False
    assert state_of(vm) == State.NOTIFIED
    assert services.notices_sweep(now=early) == []
    assert state_of(vm) == State.NOTIFIED

    assert services.notice_deadline_reached(notice=notice, now=notice.deadline) is True
    stopped = VirtualMachine.objects.get(pk=vm.pk)
    assert stopped.state == State.STOPPING
    assert stopped.stop_reason == VirtualMachine.StopReason.RECLAIMED


def test_a_stop_task_delivered_early_waits_for_the_rest_of_the_notice(notified, monkeypatch):
    vm, notice = notified
    rescheduled = []
    from gpucap.celery import app

    monkeypatch.setattr(
        app,
        "send_task",
        lambda name, args=None, **options: rescheduled.append((name, args, options)),
    )

    assert tasks.deadline_stop(notice.pk) is False

    assert state_of(vm) == State.NOTIFIED
    assert rescheduled == [("notices.deadline_stop", [notice.pk], {"eta": notice.deadline})]


def test_a_duplicate_stop_task_changes_nothing(vm_in, sent_tasks):
    vm = vm_in("running")
    notice = services.notice_issue(vm=vm, reason=Reason.ARBITER, seconds=0)

    assert tasks.deadline_stop(notice.pk) is True
    assert tasks.deadline_stop(notice.pk) is False
    assert services.notices_sweep() == []

    assert state_of(vm) == State.STOPPING
    assert events(vm, "vm.stopping") == 1


@pytest.mark.django_db(transaction=True)
def test_two_workers_delivering_the_same_stop_at_once_stop_the_vm_once(vm_in, sent_tasks):
    vm = vm_in("running")
    notice = services.notice_issue(vm=vm, reason=Reason.ARBITER, seconds=0)
    barrier = threading.Barrier(2)
    results = []

    def worker() -> None:
        try:
            barrier.wait()
            results.append(tasks.deadline_stop(notice.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(results) == [False, True]
    assert state_of(vm) == State.STOPPING
    assert events(vm, "vm.stopping") == 1
    assert [name for name, _ in sent_tasks].count("rentals.vm_stop") == 1


def test_with_the_scheduled_stop_lost_the_sweep_still_stops_the_vm(
    vm_in,
    sent_tasks,
    django_capture_on_commit_callbacks,
):
    vm = vm_in("running")
    with django_capture_on_commit_callbacks(execute=True):
        notice = services.notice_issue(vm=vm, reason=Reason.ARBITER, seconds=1)
    # The deadline task went to the (recorded) broker and was never delivered.
    assert sent_tasks == [("notices.deadline_stop", [notice.pk])]

    assert services.notices_sweep(now=notice.deadline - timedelta(milliseconds=500)) == []
    assert state_of(vm) == State.NOTIFIED

    with django_capture_on_commit_callbacks(execute=True):
        assert services.notices_sweep(now=notice.deadline) == [notice.pk]
    assert state_of(vm) == State.STOPPING
    assert ("rentals.vm_stop", [vm.pk]) in sent_tasks


def test_the_sweep_task_stops_overdue_vms(vm_in, sent_tasks):
    vm = vm_in("running")
    services.notice_issue(vm=vm, reason=Reason.ARBITER, seconds=0)

    assert tasks.sweep() == 1
    assert tasks.sweep() == 0
    assert state_of(vm) == State.STOPPING


def test_a_spot_vm_stopped_by_its_notice_keeps_its_disk_and_resumes(
    vm_in,
    sent_tasks,
    django_capture_on_commit_callbacks,
):
    vm = vm_in("running")
    with django_capture_on_commit_callbacks(execute=True):
        notice = services.notice_issue(vm=vm, reason=Reason.ARBITER, seconds=0)
        services.notice_deadline_reached(notice=notice)
        rentals.vm_mark_stopped(vm=vm)  # what the stop task does once the driver says off

    resumed = VirtualMachine.objects.get(pk=vm.pk)
    assert resumed.state == State.PENDING
    assert live_gpus(vm) == 0
    names = [name for name, _ in sent_tasks]
    assert "rentals.vm_stop" in names
    assert "rentals.vm_destroy" not in names  # the disk is kept
    notice.refresh_from_db()
    assert notice.completed_at is not None
    assert notice.outcome == Outcome.DEADLINE


def test_the_owner_may_terminate_a_spot_vm_waiting_to_resume(vm_in, sent_tasks):
    vm = vm_in("running")
    notice = services.notice_issue(vm=vm, reason=Reason.ARBITER, seconds=0)
    services.notice_deadline_reached(notice=notice)
    rentals.vm_mark_stopped(vm=vm)

    rentals.vm_terminate(vm=vm)

    assert state_of(vm) == State.TERMINATED


def test_an_on_demand_vm_never_gets_an_arbiter_notice(vm_in, sent_tasks):
    vm = vm_in("running", pool="h100-ondemand")

    with pytest.raises(Conflict, match="on-demand") as refused:
        services.notice_issue(vm=vm, reason=Reason.ARBITER)

    assert refused.value.code == "on_demand_protected"
    assert state_of(vm) == State.RUNNING
    assert not InterruptionNotice.objects.filter(vm=vm).exists()
    assert sent_tasks == []


def test_issuing_twice_sends_no_second_notice(
    vm_in,
    sent_tasks,
    django_capture_on_commit_callbacks,
):
    vm = vm_in("running")
    with django_capture_on_commit_callbacks(execute=True):
        first = services.notice_issue(vm=vm, reason=Reason.ARBITER)
        second = services.notice_issue(vm=vm, reason=Reason.DRAIN, seconds=5)

    assert second.pk == first.pk
    assert second.deadline == first.deadline
    assert InterruptionNotice.objects.filter(vm=vm).count() == 1
    assert events(vm, "notice.arbiter") == 1
    assert events(vm, "notice.drain") == 0
    assert sent_tasks == [("notices.deadline_stop", [first.pk])]


def test_a_guest_that_acknowledges_frees_its_gpus_before_the_deadline(vm_in, sent_tasks):
    vm = vm_in("running")
    notice = services.notice_issue(vm=vm, reason=Reason.ARBITER)

    services.notice_acknowledge(vm=vm)
    rentals.vm_mark_stopped(vm=vm)

    assert state_of(vm) == State.PENDING
    assert live_gpus(vm) == 0
    notice.refresh_from_db()
    assert notice.outcome == Outcome.ACKNOWLEDGED
    assert notice.completed_at < notice.deadline
    # The stop task that comes at the deadline finds nothing to do.
    assert services.notice_deadline_reached(notice=notice, now=notice.deadline) is False
    assert events(vm, "vm.stopping") == 1


def test_a_guest_that_shut_itself_down_frees_its_gpus_at_once(
    vm_in,
    sim,
    sent_tasks,
    django_capture_on_commit_callbacks,
):
    vm = vm_in("running")
    sim.create(
        VmSpec(
            instance_id=vm.instance_id,
            node=vm.node.hostname,
            gpus=(),
            image=vm.image,
            ssh_public_key=vm.ssh_public_key,
        )
    )
    notice = services.notice_issue(vm=vm, reason=Reason.ARBITER)
    sim.stop(vm.instance_id, vm.node.hostname, grace_seconds=0)  # the guest powered off

    with django_capture_on_commit_callbacks(execute=True):
        repairs = vms_reconcile()

    assert [r.vm_id for r in repairs] == [vm.pk]
    assert state_of(vm) == State.PENDING  # a spot VM: resumes when capacity returns
    assert live_gpus(vm) == 0
    notice.refresh_from_db()
    assert notice.outcome == Outcome.GUEST_SHUTDOWN
    assert notice.completed_at < notice.deadline
    assert "rentals.vm_destroy" not in [name for name, _ in sent_tasks]
