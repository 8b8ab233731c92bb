"""The driver tasks, run in this process (``.apply()``: retries run inline, countdowns skipped)
against the simulated fleet in Redis: what each task asks the hypervisor, what it records, and
that a retried, duplicated or late task changes nothing the second time."""

import json
import threading

import pytest
from django.db import connection

from gpucap.audit.models import AuditEvent
from gpucap.drivers.base import BOOTING, MISSING, RUNNING, STOPPED, VmSpec
from gpucap.drivers.simulated import ip_address_for
from gpucap.rentals import services, tasks
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.rentals.reconcile import vm_driver_lock
from gpucap.usage.models import UsageInterval

State = VirtualMachine.State


@pytest.fixture
def fast_boot(fleet_east):
    """The cluster's simulated VMs boot at once (the first poll finds them running)."""
    cluster = fleet_east["cluster"]
    cluster.driver_settings = {"boot_seconds": 0}
    cluster.save(update_fields=["driver_settings"])
    return cluster


def on_hypervisor(sim, vm: VirtualMachine) -> dict | None:
    """The simulated hypervisor's record of the VM (its documented Redis key), or None."""
    raw = sim.redis.get(f"gpucap:sim:{sim.namespace}:vm:{vm.node.hostname}:{vm.instance_id}")
    return None if raw is None else json.loads(raw)


def boot_on_hypervisor(sim, vm: VirtualMachine) -> None:
    spec = VmSpec(
        instance_id=vm.instance_id,
        node=vm.node.hostname,
        gpus=(),
        image=vm.image,
        ssh_public_key=vm.ssh_public_key,
    )
    sim.create(spec)


def events(vm: VirtualMachine, verb: str):
    return AuditEvent.objects.filter(object_id=str(vm.pk), verb=verb)


def live_gpus(vm: VirtualMachine) -> list[int]:
    held = Allocation.objects.filter(vm=vm, released_at=None)
    return sorted(held.values_list("gpu__index", flat=True))


# --- rentals.vm_provision -----------------------------------------------------------------------


def test_provision_creates_the_vm_with_its_gpus_and_marks_it_running(vm_in, sim, fast_boot):
    vm = vm_in("provisioning", gpus=(4, 5, 6, 7))

    tasks.vm_provision.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == State.RUNNING
    assert vm.ip_address == ip_address_for(vm.instance_id)
    assert vm.started_at is not None
    domain = on_hypervisor(sim, vm)
    pci = list(vm.allocations.order_by("gpu__index").values_list("gpu__pci_address", flat=True))
    assert domain["gpus"] == pci and len(pci) == 4
    assert domain["image"] == vm.image
    assert events(vm, "vm.running").count() == 1


def test_a_duplicated_provision_changes_nothing_the_second_time(vm_in, sim, fast_boot):
    vm = vm_in("provisioning", gpus=(0, 1))
    tasks.vm_provision.apply(args=[vm.pk])
    vm.refresh_from_db()
    first = (vm.state, vm.ip_address, vm.started_at, vm.updated_at, on_hypervisor(sim, vm))

    tasks.vm_provision.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert (vm.state, vm.ip_address, vm.started_at, vm.updated_at, on_hypervisor(sim, vm)) == first
    assert events(vm, "vm.running").count() == 1
    assert UsageInterval.objects.filter(vm=vm).count() == 1
    assert live_gpus(vm) == [0, 1]


@pytest.mark.parametrize("state", [State.PENDING, State.STOPPING, State.TERMINATED])
def test_a_late_provision_for_a_vm_that_moved_on_does_not_touch_the_hypervisor(
    vm_in, sim, fast_boot, state
):
    vm = vm_in(state)

    tasks.vm_provision.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == state
    assert sim.redis.keys(f"gpucap:sim:{sim.namespace}:vm:*") == []


def test_transient_driver_failures_are_retried_until_the_vm_runs(vm_in, sim, fast_boot):
    vm = vm_in("provisioning")
    sim.failure_inject("create", "libvirtd on h100-001 is not answering", times=2, transient=True)

    result = tasks.vm_provision.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert result.successful()
    assert vm.state == State.RUNNING
    assert events(vm, "vm.running").count() == 1


def test_a_lost_reply_after_create_is_retried_without_a_second_vm(vm_in, sim, fast_boot):
    vm = vm_in("provisioning")
    sim.failure_inject("create", "connection reset by peer", transient=True, after=True)

    tasks.vm_provision.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == State.RUNNING
    assert len(sim.redis.keys(f"gpucap:sim:{sim.namespace}:vm:*")) == 1


def test_after_the_last_retry_the_vm_fails_with_the_drivers_message(
    vm_in, sim, fast_boot, settings
):
    settings.RENTALS_DRIVER_MAX_RETRIES = 2
    vm = vm_in("provisioning", gpus=(0, 1))
    sim.failure_inject(
        "create", "libvirtd on h100-001 is not answering", times=None, transient=True
    )

    tasks.vm_provision.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == State.FAILED
    assert vm.failure_reason == (
        "libvirtd on h100-001 is not answering (still failing after 2 retries)"
    )
    assert live_gpus(vm) == []
    assert not UsageInterval.objects.filter(vm=vm, ended_at=None).exists()
    assert on_hypervisor(sim, vm) is None


def test_a_permanent_driver_error_fails_the_vm_at_once_and_frees_its_gpus(
    vm_in, sim, fast_boot, settings
):
    settings.RENTALS_DRIVER_MAX_RETRIES = 5
    vm = vm_in("provisioning", gpus=(0, 1))
    sim.failure_inject("create", "IOMMU group 42 is not viable", times=1)

    tasks.vm_provision.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == State.FAILED
    assert vm.failure_reason == "IOMMU group 42 is not viable"
    assert events(vm, "vm.failed").get().message == "IOMMU group 42 is not viable"
    assert live_gpus(vm) == []
    assert on_hypervisor(sim, vm) is None, "nothing is left holding the GPUs on the host"


def test_a_cluster_with_wrong_driver_settings_fails_the_vm_naming_the_setting(
    vm_in, sim, fleet_east
):
    vm = vm_in("provisioning")
    cluster = fleet_east["cluster"]
    cluster.driver_settings = {"boot_secs": 1}
    cluster.save(update_fields=["driver_settings"])

    tasks.vm_provision.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == State.FAILED
    assert vm.failure_reason.startswith("cluster east: simulated driver settings: ")
    assert "unknown setting 'boot_secs'" in vm.failure_reason
    assert live_gpus(vm) == []


def test_a_slow_boot_is_polled_a_bounded_number_of_times_then_left_to_the_reconciler(
    vm_in, sim, fleet_east, settings
):
    settings.RENTALS_POLLS = 3
    cluster = fleet_east["cluster"]
    cluster.driver_settings = {"boot_seconds": 600}
    cluster.save(update_fields=["driver_settings"])
    vm = vm_in("provisioning")

    result = tasks.vm_provision.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert result.successful()
    assert vm.state == State.PROVISIONING
    assert on_hypervisor(sim, vm)["state"] == BOOTING
    assert result.result is None


def test_a_vm_some_other_task_is_driving_is_left_alone(vm_in, sim, fast_boot, settings):
    settings.RENTALS_POLLS = 0
    vm = vm_in("provisioning")
    holding, release = threading.Event(), threading.Event()

    def other_task() -> None:
        with vm_driver_lock(vm.pk) as taken:
            assert taken
            holding.set()
            release.wait(timeout=10)
        connection.close()

    thread = threading.Thread(target=other_task)
    thread.start()
    try:
        assert holding.wait(timeout=10)
        tasks.vm_provision.apply(args=[vm.pk])
        assert on_hypervisor(sim, vm) is None, "no driver call while another task drives it"
    finally:
        release.set()
        thread.join(timeout=10)
    vm.refresh_from_db()
    assert vm.state == State.PROVISIONING


def test_a_vm_placed_again_on_the_node_that_keeps_its_disk_is_started(vm_in, sim, fast_boot):
    vm = vm_in("provisioning")
    boot_on_hypervisor(sim, vm)
    sim.stop(vm.instance_id, vm.node.hostname, grace_seconds=0)
    assert on_hypervisor(sim, vm)["state"] == STOPPED

    tasks.vm_provision.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == State.RUNNING
    assert sim.status(vm.instance_id, vm.node.hostname).state == RUNNING


# --- rentals.vm_stop ----------------------------------------------------------------------------


def test_an_owner_stop_shuts_the_vm_down_and_ends_stopped(vm_in, sim, fast_boot):
    vm = vm_in("stopping")
    boot_on_hypervisor(sim, vm)

    tasks.vm_stop.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == State.STOPPED
    assert sim.status(vm.instance_id, vm.node.hostname).state == STOPPED, "disk kept"
    assert live_gpus(vm) == []


def test_a_preempted_spot_vm_is_shut_down_and_waits_again(vm_in, sim, fast_boot):
    vm = vm_in("running", pool="h100-spot")
    boot_on_hypervisor(sim, vm)
    services.vm_preempt(vm=vm, for_vm=vm_in("pending", pool="h100-ondemand"))

    tasks.vm_stop.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == State.PENDING
    assert sim.status(vm.instance_id, vm.node.hostname).state == STOPPED


def resumed_elsewhere(vm_in, sim, fleet_east, sent_tasks, capture, *, node: str):
    """A running spot VM on h100-001, preempted, shut down, then placed again on ``node``."""
    vm = vm_in("running", pool="h100-spot", node="h100-001", gpus=(0,))
    boot_on_hypervisor(sim, vm)
    services.vm_preempt(vm=vm, for_vm=vm_in("pending", pool="h100-ondemand"))
    tasks.vm_stop.apply(args=[vm.pk])
    with capture(execute=True):
        vm = services.vm_place(vm=vm, node=fleet_east["nodes"][node], gpu_indices=[1])
    return vm


def test_a_spot_vm_resumed_on_another_node_is_removed_from_the_node_it_left(
    vm_in, sim, fast_boot, fleet_east, sent_tasks, django_capture_on_commit_callbacks
):
    vm = resumed_elsewhere(
        vm_in, sim, fleet_east, sent_tasks, django_capture_on_commit_callbacks, node="h100-002"
    )
    left = fleet_east["nodes"]["h100-001"]
    assert ("rentals.vm_destroy_left", [vm.pk, left.pk]) in sent_tasks
    assert sim.status(vm.instance_id, "h100-001").state == STOPPED

    tasks.vm_destroy_left.apply(args=[vm.pk, left.pk])
    tasks.vm_provision.apply(args=[vm.pk])
    tasks.vm_destroy_left.apply(args=[vm.pk, left.pk])  # a duplicate changes nothing

    vm.refresh_from_db()
    assert sim.status(vm.instance_id, "h100-001").state == MISSING
    assert (vm.state, vm.node.hostname) == (State.RUNNING, "h100-002")
    assert sim.status(vm.instance_id, "h100-002").state == RUNNING


def test_a_spot_vm_resumed_on_the_same_node_keeps_its_disk_there(
    vm_in, sim, fast_boot, fleet_east, sent_tasks, django_capture_on_commit_callbacks
):
    vm = resumed_elsewhere(
        vm_in, sim, fleet_east, sent_tasks, django_capture_on_commit_callbacks, node="h100-001"
    )
    assert not [name for name, _ in sent_tasks if name == "rentals.vm_destroy_left"]
    left = fleet_east["nodes"]["h100-001"]

    tasks.vm_destroy_left.apply(args=[vm.pk, left.pk])  # late, from an earlier move: ignored

    assert sim.status(vm.instance_id, "h100-001").state == STOPPED


def test_a_terminate_shuts_the_vm_down_then_sends_the_destroy(
    vm_in, sim, fast_boot, sent_tasks, django_capture_on_commit_callbacks
):
    vm = vm_in("running")
    boot_on_hypervisor(sim, vm)
    services.vm_terminate(vm=vm)

    with django_capture_on_commit_callbacks(execute=True):
        tasks.vm_stop.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == State.TERMINATED
    assert sent_tasks == [("rentals.vm_destroy", [vm.pk])]


def test_stopping_a_vm_the_hypervisor_never_had_completes_the_stop(vm_in, sim, fast_boot):
    vm = vm_in("stopping")  # e.g. terminated before its provision task ran

    tasks.vm_stop.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == State.STOPPED


def test_a_duplicated_stop_changes_nothing_the_second_time(vm_in, sim, fast_boot):
    vm = vm_in("stopping")
    boot_on_hypervisor(sim, vm)
    tasks.vm_stop.apply(args=[vm.pk])
    vm.refresh_from_db()
    first = (vm.state, vm.updated_at, AuditEvent.objects.count())

    tasks.vm_stop.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert (vm.state, vm.updated_at, AuditEvent.objects.count()) == first


def test_a_stop_the_host_never_answers_keeps_the_vm_stopping_for_the_reconciler(
    vm_in, sim, fast_boot, settings
):
    settings.RENTALS_DRIVER_MAX_RETRIES = 1
    vm = vm_in("stopping", gpus=(0,))
    boot_on_hypervisor(sim, vm)
    sim.failure_inject("stop", "no route to host h100-001", times=None, transient=True)

    tasks.vm_stop.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == State.STOPPING, "the VM may still run: its GPUs are not handed out"
    assert live_gpus(vm) == [0]


def test_a_stop_the_hypervisor_refuses_fails_the_vm_with_its_message(vm_in, sim, fast_boot):
    vm = vm_in("stopping")
    boot_on_hypervisor(sim, vm)
    sim.failure_inject("stop", "domain is locked by another management tool")

    tasks.vm_stop.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == State.FAILED
    assert vm.failure_reason == "domain is locked by another management tool"


# --- rentals.vm_destroy -------------------------------------------------------------------------


def test_destroy_removes_a_terminated_vm_from_its_node_and_twice_is_harmless(vm_in, sim, fast_boot):
    vm = vm_in("stopped")
    boot_on_hypervisor(sim, vm)
    services.vm_terminate(vm=vm)

    tasks.vm_destroy.apply(args=[vm.pk])
    assert on_hypervisor(sim, vm) is None
    tasks.vm_destroy.apply(args=[vm.pk])

    vm.refresh_from_db()
    assert vm.state == State.TERMINATED
    assert sim.status(vm.instance_id, vm.node.hostname).state == MISSING


def test_destroy_never_touches_a_vm_that_is_alive(vm_in, sim, fast_boot):
    vm = vm_in("running")
    boot_on_hypervisor(sim, vm)

    tasks.vm_destroy.apply(args=[vm.pk])

    assert on_hypervisor(sim, vm) is not None
    vm.refresh_from_db()
    assert vm.state == State.RUNNING


def test_destroy_retries_a_host_that_does_not_answer(vm_in, sim, fast_boot):
    vm = vm_in("stopped")
    boot_on_hypervisor(sim, vm)
    services.vm_terminate(vm=vm)
    sim.failure_inject("destroy", "no route to host h100-001", times=2, transient=True)

    tasks.vm_destroy.apply(args=[vm.pk])

    assert on_hypervisor(sim, vm) is None


# --- rentals.reconcile (rentals.standalone_place: tests/plans/test_standalone.py) ----------------


def test_the_reconciler_runs_on_beat(settings):
    from gpucap.celery import app

    entry = next(
        e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "rentals.reconcile"
    )
    assert entry["schedule"] <= 60
    app.loader.import_default_modules()
    assert app.tasks["rentals.reconcile"].run is tasks.reconcile.run


def test_the_reconcile_task_repairs_drift(vm_in, sim, fast_boot):
    vm = vm_in("provisioning")
    boot_on_hypervisor(sim, vm)

    assert tasks.reconcile.apply().result == 1

    vm.refresh_from_db()
    assert vm.state == State.RUNNING
