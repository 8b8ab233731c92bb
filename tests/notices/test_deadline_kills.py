"""A deadline is kept through a worker killed while it holds the stop: the VM is ``stopping``
in the database on time, the worker dies before the driver's stop is sent, and the notices
sweep sends it again within one sweep interval, once (not the reconciler, after its grace
period). End to end with real workers and beat, then the resend itself, service by service."""

import re
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.drivers.base import RUNNING, VmSpec
from gpucap.notices import services
from gpucap.notices.models import InterruptionNotice
from gpucap.rentals.models import VirtualMachine
from gpucap.rentals.reconcile import vm_driver_lock
from tests.rentals.conftest import SSH_KEY, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

State = VirtualMachine.State
KILL_AT = "notices.deadline:stopping"
SWEEP_SECONDS = 2
NOTICE_SECONDS = 8
# Beyond the sweep interval, what a loaded two-core machine may take to deliver the stop: the
# deadline's task or sweep reaching a worker, then the resent ``rentals.vm_stop`` reaching one
# and its driver call landing.
PICKUP = timedelta(seconds=2)


@pytest.fixture
def running_on_the_hypervisor(vm_in, sim):
    """A running spot VM of acme, up on the simulated hypervisor as the database says."""
    vm = vm_in("running")
    sim.create(
        VmSpec(
            instance_id=vm.instance_id,
            node=vm.node.hostname,
            gpus=(),
            image=vm.image,
            ssh_public_key=SSH_KEY,
        )
    )
    assert sim.status(vm.instance_id, vm.node.hostname).state == RUNNING
    return vm


def test_a_worker_killed_holding_a_deadlines_stop_is_covered_by_the_next_sweep(
    workers, running_on_the_hypervisor, sim
):
    """Two workers, both dying at the kill point: the deadline is taken by one of them, by its
    scheduled stop or by a sweep that finds it overdue (which comes first is a race between
    beat's clock and the eta, and either is a deadline kept), and whichever it is dies there
    with the VM stopping and no stop sent. The other lives on: the resend does not pass the
    kill point, it runs only the sweep's resend and the driver's stop. (One doomed worker beside
    a survivor was flaky: a survivor's sweep falling due with the deadline stopped the VM
    itself, and the doomed worker's on-time stop found nothing left to do.)"""
    vm = running_on_the_hypervisor
    sweep = {"NOTICES_SWEEP_SECONDS": str(SWEEP_SECONDS)}
    pair = [workers(**sweep, TEST_KILL_AT=KILL_AT) for _ in range(2)]
    workers(beat=True, **sweep)
    notice = services.notice_issue(
        vm=vm, reason=InterruptionNotice.Reason.RECLAIM, seconds=NOTICE_SECONDS
    )

    def logs() -> str:
        return "\n".join(worker.log() for worker in pair)

    def stop_reached_the_driver():
        if sim.status(vm.instance_id, vm.node.hostname).state != RUNNING:
            return timezone.now()
        return None

    stopped_at = wait_for(
        stop_reached_the_driver, timeout=NOTICE_SECONDS + 60, what="the stop", log=logs
    )
    (doomed,) = [worker for worker in pair if worker.process.poll() is not None]
    (survivor,) = [worker for worker in pair if worker is not doomed]
    assert f"kill point {KILL_AT}: SIGKILL" in doomed.log(), doomed.log()
    assert "Task rentals.vm_stop[" not in doomed.log(), "the doomed worker sent no stop"
    timeline = list(
        AuditEvent.objects.filter(object_id=str(vm.pk)).values_list("verb", "created_at")
    )
    late = stopped_at - notice.deadline
    assert timedelta(0) <= late <= timedelta(seconds=SWEEP_SECONDS) + PICKUP, (
        f"stopped {late} after the deadline {notice.deadline}; {timeline}"
    )
    # Sent again once, by the sweep; the hypervisor was asked to stop it once.
    assert AuditEvent.objects.filter(verb=services.STOP_RESENT, object_id=str(vm.pk)).count() == 1
    assert len(set(re.findall(r"Task rentals\.vm_stop\[([-\w]+)\]", survivor.log()))) == 1
    assert not AuditEvent.objects.filter(verb="vm.reconcile", object_id=str(vm.pk)).exists()
    wait_for(
        lambda: VirtualMachine.objects.get(pk=vm.pk).state == State.PENDING,
        timeout=30,
        what="the reclaimed spot VM to wait to resume",
        log=survivor.log,
    )
    assert survivor.process.poll() is None, survivor.log()


# --- the resend itself: once, and never for a VM a task drives ----------------------------------


@pytest.fixture
def stopping_past_deadline(vm_in, sent_tasks, django_capture_on_commit_callbacks):
    """A VM whose deadline came: stopping in the database, its vm_stop sent (and lost)."""
    vm = vm_in("running")
    notice = services.notice_issue(vm=vm, reason=InterruptionNotice.Reason.ARBITER, seconds=0)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.notice_deadline_reached(notice=notice)
    assert ("rentals.vm_stop", [vm.pk]) in sent_tasks
    sent_tasks.clear()
    return vm


def test_the_sweep_sends_a_lost_stop_again_once_per_interval(
    stopping_past_deadline, sent_tasks, django_capture_on_commit_callbacks, settings
):
    vm = stopping_past_deadline
    with django_capture_on_commit_callbacks(execute=True):
        assert services.notice_stops_resend() == [vm.pk]
        assert services.notice_stops_resend() == []  # the same sweep interval
    assert sent_tasks == [("rentals.vm_stop", [vm.pk])]

    later = timezone.now() + timedelta(seconds=settings.NOTICES_SWEEP_SECONDS)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.notice_stops_resend(now=later) == [vm.pk]  # lost again: sent again
    assert sent_tasks == [("rentals.vm_stop", [vm.pk])] * 2


def test_two_sweeps_at_once_send_the_stop_once(stopping_past_deadline, sent_tasks):
    vm = stopping_past_deadline
    barrier = threading.Barrier(2)
    results = []

    def sweep() -> None:
        try:
            barrier.wait()
            results.append(services.notice_stops_resend())
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(results) == [[], [vm.pk]]
    assert sent_tasks == [("rentals.vm_stop", [vm.pk])]


def test_a_stop_a_task_is_driving_is_left_to_it(stopping_past_deadline, sent_tasks):
    vm = stopping_past_deadline
    holding, done = threading.Event(), threading.Event()

    def driving() -> None:  # a vm_stop task in the middle of its driver call
        try:
            with vm_driver_lock(vm.pk) as taken:
                assert taken
                holding.set()
                done.wait(timeout=30)
        finally:
            connection.close()

    thread = threading.Thread(target=driving)
    thread.start()
    holding.wait(timeout=30)
    try:
        assert services.notice_stops_resend() == []
    finally:
        done.set()
        thread.join(timeout=30)
    assert sent_tasks == []


def test_a_stop_without_an_overdue_notice_is_left_to_the_reconciler(vm_in, sent_tasks):
    owners = vm_in("stopping")  # stopped by its owner: no notice, no deadline
    notified = vm_in("running", gpus=(1,))
    services.notice_issue(vm=notified, reason=InterruptionNotice.Reason.ARBITER, seconds=60)
    services.notice_acknowledge(vm=notified)  # stopping before its deadline

    assert services.notice_stops_resend() == []
    assert VirtualMachine.objects.get(pk=owners.pk).state == State.STOPPING
    assert VirtualMachine.objects.get(pk=notified.pk).state == State.STOPPING
