"""The reconciler: each kind of drift between the simulated hypervisor and the database is
repaired once, logged and audited; nothing else is touched; and it stays correct while tasks
(or a second reconciler) work on the same VMs."""

import logging
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.drivers.base import DriverUnavailable, VmSpec, VmStatus
from gpucap.rentals import reconcile, services
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.rentals.reconcile import LOST_BY_HYPERVISOR, vm_driver_lock, vms_reconcile

State = VirtualMachine.State


def boot_on_hypervisor(sim, vm: VirtualMachine) -> None:
    sim.create(
        VmSpec(
            instance_id=vm.instance_id,
            node=vm.node.hostname,
            gpus=(),
            image=vm.image,
            ssh_public_key=vm.ssh_public_key,
        )
    )


def events(vm: VirtualMachine, verb: str):
    return AuditEvent.objects.filter(object_id=str(vm.pk), verb=verb)


def live_gpus(vm: VirtualMachine) -> list[int]:
    held = Allocation.objects.filter(vm=vm, released_at=None)
    return sorted(held.values_list("gpu__index", flat=True))


@pytest.fixture
def sent(sent_tasks, django_capture_on_commit_callbacks):
    """Run the reconciler with the tasks it sends recorded (sent after commit)."""

    def run(**options):
        with django_capture_on_commit_callbacks(execute=True):
            return vms_reconcile(**options)

    run.tasks = sent_tasks
    return run


def test_a_vm_that_booted_while_no_task_watched_is_marked_running(vm_in, sim, sent, caplog):
    vm = vm_in("provisioning")
    boot_on_hypervisor(sim, vm)

    with caplog.at_level(logging.WARNING, logger="gpucap.rentals.reconcile"):
        repairs = sent()

    vm.refresh_from_db()
    assert vm.state == State.RUNNING
    assert vm.ip_address == sim.status(vm.instance_id, vm.node.hostname).ip_address
    assert [str(r) for r in repairs] == [
        f"{vm.instance_id}: provisioning here, running on the hypervisor: marked running"
    ]
    assert f"{vm.instance_id}: provisioning here, running on the hypervisor" in caplog.text
    audit = events(vm, "vm.reconcile").get()
    assert audit.before == {"state": "provisioning", "driver_state": "running"}
    assert audit.after == {"action": "marked running"}
    assert events(vm, "vm.running").count() == 1


def test_a_provision_task_that_never_ran_is_sent_again_after_the_grace_period(vm_in, sim, sent):
    vm = vm_in("provisioning")

    assert sent(grace_seconds=120) == []
    assert sent.tasks == [], "within the grace period the task may still be on its way"

    repairs = sent(grace_seconds=120, now=timezone.now() + timedelta(seconds=121))
    assert [r.action for r in repairs] == ["sent rentals.vm_provision again"]
    assert sent.tasks == [("rentals.vm_provision", [vm.pk])]
    vm.refresh_from_db()
    assert vm.state == State.PROVISIONING
    assert live_gpus(vm) == [0], "the VM keeps its GPUs while its task is sent again"


def test_a_vm_that_never_boots_fails_after_the_boot_timeout_and_is_cleaned_up(vm_in, sim, sent):
    vm = vm_in("provisioning", gpus=(0, 1))

    repairs = sent(boot_timeout_seconds=900, now=timezone.now() + timedelta(seconds=901))

    assert [r.action for r in repairs] == ["marked failed"]
    vm.refresh_from_db()
    assert vm.state == State.FAILED
    assert vm.failure_reason == "did not boot within 900 s"
    assert live_gpus(vm) == []
    assert sent.tasks == [("rentals.vm_destroy", [vm.pk])]


@pytest.mark.parametrize("state", [State.RUNNING, State.NOTIFIED])
def test_an_on_demand_vm_the_hypervisor_lost_is_failed_with_a_clear_reason(vm_in, sim, sent, state):
    vm = vm_in(state, pool="h100-ondemand", gpus=(2, 3))  # nothing on the hypervisor

    repairs = sent()

    assert [r.action for r in repairs] == ["its host was lost"]
    vm.refresh_from_db()
    assert vm.state == State.FAILED
    assert LOST_BY_HYPERVISOR == "the hypervisor no longer knows this VM"
    assert vm.failure_reason == (
        "its host h100-001 was lost: the hypervisor no longer knows this VM"
    )
    assert live_gpus(vm) == []
    assert events(vm, "vm.failed").get().message == vm.failure_reason


@pytest.mark.parametrize("state", [State.RUNNING, State.NOTIFIED])
def test_a_spot_vm_the_hypervisor_lost_waits_to_resume_elsewhere_on_a_fresh_disk(
    vm_in, sim, sent, state
):
    vm = vm_in(state, pool="h100-spot", gpus=(2, 3))  # nothing on the hypervisor

    assert [r.action for r in sent()] == ["its host was lost"]

    vm.refresh_from_db()
    assert vm.state == State.PENDING
    assert live_gpus(vm) == []
    assert vm.failure_reason == (
        "its host h100-001 was lost: the hypervisor no longer knows this VM"
    )
    assert events(vm, "vm.pending").get().message == (
        "its host h100-001 was lost: the hypervisor no longer knows this VM; its GPUs are "
        "released and it resumes elsewhere on a fresh disk from ubuntu-24.04-cuda-12.6"
    )
    # Its disk went with the host: nothing to prefer when it is placed again.
    assert vm.disk_node_id is None


def test_a_guest_that_shut_itself_down_is_stopped_as_its_owner_would(vm_in, sim, sent):
    vm = vm_in("running")
    boot_on_hypervisor(sim, vm)
    sim.stop(vm.instance_id, vm.node.hostname, grace_seconds=0)

    repairs = sent()

    assert [r.action for r in repairs] == ["stopping it: the guest shut down"]
    vm.refresh_from_db()
    assert (vm.state, vm.stop_reason) == (State.STOPPING, VirtualMachine.StopReason.OWNER)
    assert sent.tasks == [("rentals.vm_stop", [vm.pk])]


@pytest.mark.parametrize("on_hypervisor", ["stopped", "missing"])
def test_a_stop_that_finished_unrecorded_is_completed(vm_in, sim, sent, on_hypervisor):
    vm = vm_in("stopping", gpus=(0,))
    if on_hypervisor == "stopped":
        boot_on_hypervisor(sim, vm)
        sim.stop(vm.instance_id, vm.node.hostname, grace_seconds=0)

    repairs = sent()

    assert [r.action for r in repairs] == ["marked stopped"]
    vm.refresh_from_db()
    assert vm.state == State.STOPPED
    assert live_gpus(vm) == []


def test_a_stop_task_that_was_lost_is_sent_again_after_the_grace_period(vm_in, sim, sent):
    vm = vm_in("stopping")
    boot_on_hypervisor(sim, vm)

    assert sent(grace_seconds=120) == []
    repairs = sent(grace_seconds=120, now=timezone.now() + timedelta(seconds=121))

    assert [r.action for r in repairs] == ["sent rentals.vm_stop again"]
    assert sent.tasks == [("rentals.vm_stop", [vm.pk])]


def test_vms_in_agreement_are_left_alone(vm_in, sim, sent):
    running = vm_in("running", gpus=(0,))
    booting = vm_in("provisioning", gpus=(1,))
    boot_on_hypervisor(sim, running)
    sim_slow = type(sim)({"boot_seconds": 600})
    sim_slow.create(
        VmSpec(
            instance_id=booting.instance_id,
            node="h100-001",
            gpus=(),
            image=booting.image,
            ssh_public_key=booting.ssh_public_key,
        )
    )
    vm_in("pending")  # a set pool's VM: the arbiter's, not the standalone placement's
    before = AuditEvent.objects.count()

    assert sent(grace_seconds=0) == []

    assert AuditEvent.objects.count() == before
    assert sent.tasks == []
    running.refresh_from_db()
    booting.refresh_from_db()
    assert (running.state, booting.state) == (State.RUNNING, State.PROVISIONING)


def test_pending_standalone_vms_ask_their_clusters_placement_to_look_again(vm_in, sim, sent):
    vm_in("pending", pool="a100-standalone", node="a100-001")
    vm_in("pending", pool="a100-standalone", node="a100-001")
    vm_in("pending", pool="h100-spot")

    assert sent() == []

    cluster = VirtualMachine.objects.filter(pool__name="a100-standalone").first().pool.cluster_id
    assert sent.tasks == [("rentals.standalone_place", [cluster])]


def test_a_second_pass_finds_nothing_left_to_repair(vm_in, sim, sent):
    provisioning = vm_in("provisioning", gpus=(0,))
    lost = vm_in("running", pool="h100-ondemand", gpus=(1,))
    boot_on_hypervisor(sim, provisioning)

    assert len(sent()) == 2
    assert sent() == []
    assert events(provisioning, "vm.running").count() == 1
    assert events(lost, "vm.failed").count() == 1


def test_a_host_that_does_not_answer_is_skipped_and_the_rest_repaired(
    vm_in, sim, sent, monkeypatch, caplog
):
    unreachable, booted = vm_in("running", gpus=(0,)), vm_in("provisioning", gpus=(1,))
    boot_on_hypervisor(sim, booted)
    real_status = type(sim).status

    def status(driver, instance_id, node):
        if instance_id == unreachable.instance_id:
            raise DriverUnavailable("no route to host h100-001")
        return real_status(driver, instance_id, node)

    monkeypatch.setattr(type(sim), "status", status)
    with caplog.at_level(logging.WARNING, logger="gpucap.rentals.reconcile"):
        repairs = sent()

    assert [r.vm_id for r in repairs] == [booted.pk]
    unreachable.refresh_from_db()
    assert unreachable.state == State.RUNNING, "unreachable is not lost"
    assert "no route to host h100-001" in caplog.text


def test_a_vm_a_task_is_driving_is_left_to_that_task(vm_in, sim, sent):
    vm = vm_in("provisioning")
    boot_on_hypervisor(sim, vm)
    holding, release = threading.Event(), threading.Event()

    def task() -> None:
        with vm_driver_lock(vm.pk):
            holding.set()
            release.wait(timeout=10)
        connection.close()

    thread = threading.Thread(target=task)
    thread.start()
    try:
        assert holding.wait(timeout=10)
        assert sent() == []
    finally:
        release.set()
        thread.join(timeout=10)
    vm.refresh_from_db()
    assert vm.state == State.PROVISIONING


def test_a_vm_that_moved_on_while_judged_is_not_repaired(vm_in, sim, sent, monkeypatch):
    """The provision task marks the VM running between the reconciler's look at the hypervisor
    and its repair: the repair sees the VM changed and does nothing."""
    vm = vm_in("provisioning")
    boot_on_hypervisor(sim, vm)
    real = reconcile._driver_status

    def status_then_task_finishes(judged):
        status = real(judged)
        services.vm_mark_running(vm=judged, ip_address=status.ip_address)
        return status

    monkeypatch.setattr(reconcile, "_driver_status", status_then_task_finishes)

    assert sent() == []
    assert events(vm, "vm.running").count() == 1
    assert not events(vm, "vm.reconcile").exists()


@pytest.mark.django_db(transaction=True)
def test_two_reconcilers_at_once_repair_each_vm_once(vm_in, sim, sent_tasks):
    vms = [vm_in("provisioning", gpus=(i,)) for i in range(4)]
    lost = vm_in("running", pool="h100-ondemand", gpus=(4,))
    for vm in vms:
        boot_on_hypervisor(sim, vm)
    barrier = threading.Barrier(3)
    errors = []

    def run() -> None:
        try:
            barrier.wait(timeout=10)
            vms_reconcile()
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    for vm in vms:
        vm.refresh_from_db()
        assert vm.state == State.RUNNING
        assert events(vm, "vm.running").count() == 1
        assert events(vm, "vm.reconcile").count() == 1
    assert events(lost, "vm.failed").count() == 1


def test_a_hypervisor_reporting_a_crash_fails_the_vm_with_its_message(
    vm_in, sim, sent, monkeypatch
):
    vm = vm_in("running")
    monkeypatch.setattr(
        reconcile,
        "_driver_status",
        lambda judged: VmStatus(state="failed", message="guest kernel panic"),
    )

    assert [r.action for r in sent()] == ["marked failed"]

    vm.refresh_from_db()
    assert (vm.state, vm.failure_reason) == (State.FAILED, "guest kernel panic")
    assert sent.tasks == [("rentals.vm_destroy", [vm.pk])]
