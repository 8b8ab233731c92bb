"""VMs driven by a REAL Celery worker (a ``celery worker`` subprocess) on real Redis and this
test database, through the simulated driver: the whole path a tenant's request takes, and what
happens when the worker is killed with SIGKILL mid-task, a task arrives twice, or the driver
fails for a while or for good."""

import re

import pytest
from django.db.models import Count

from gpucap.audit.models import AuditEvent
from gpucap.celery import app
from gpucap.fleet import services as fleet
from gpucap.rentals import services
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.rentals.reconcile import vms_reconcile
from gpucap.usage.models import UsageInterval
from tests.rentals.conftest import SSH_KEY, queue_in_flight, queue_purge, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

State = VirtualMachine.State


@pytest.fixture
def boot_in(fleet_east):
    """``boot_in(seconds)``: how long the cluster's simulated VMs take to boot (half a second
    unless a test says otherwise)."""

    def set_boot(seconds: float) -> None:
        cluster = fleet_east["cluster"]
        cluster.driver_settings = {"boot_seconds": seconds}
        cluster.save(update_fields=["driver_settings"])

    set_boot(0.5)
    return set_boot


@pytest.fixture
def standalone_pool(fleet_east, tenant, boot_in):
    """Tenant acme may rent from the standalone A100 pool (placed by standalone placement)."""
    pool = fleet_east["pools"]["a100-standalone"]
    fleet.pool_set_tenants(pool=pool, tenants=[tenant])
    return pool


def request(tenant, pool, name: str, gpu_count: int = 1) -> VirtualMachine:
    return services.vm_request(
        tenant=tenant,
        pool=pool,
        name=name,
        gpu_count=gpu_count,
        image="ubuntu-24.04-cuda-12.6",
        ssh_public_key=SSH_KEY,
    )


def state_of(vm: VirtualMachine) -> str:
    return VirtualMachine.objects.values_list("state", flat=True).get(pk=vm.pk)


def verbs(vm: VirtualMachine) -> list[str]:
    found = AuditEvent.objects.filter(object_type="virtualmachine", object_id=str(vm.pk))
    return list(found.order_by("id").values_list("verb", flat=True))


def assert_running_exactly_once(vm: VirtualMachine) -> None:
    """One boot recorded, one open usage interval, one set of GPUs, no card held twice."""
    vm.refresh_from_db()
    assert vm.state == State.RUNNING
    assert vm.ip_address
    assert verbs(vm).count("vm.running") == 1
    assert UsageInterval.objects.filter(vm=vm, ended_at=None).count() == 1
    live = Allocation.objects.filter(vm=vm, released_at=None)
    assert live.count() == vm.gpu_count
    assert set(live.values_list("gpu__node_id", flat=True)) == {vm.node_id}
    doubled = (
        Allocation.objects.filter(released_at=None)
        .values("gpu")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    assert not doubled.exists()


def idle(queue: str, ignore: set[str] = frozenset()) -> bool:
    return not set(queue_in_flight(queue)) - set(ignore)


def test_a_requested_standalone_vm_goes_pending_provisioning_running(
    workers, standalone_pool, tenant, sim
):
    worker = workers()

    vm = request(tenant, standalone_pool, "train-1", gpu_count=4)

    wait_for(lambda: state_of(vm) == State.RUNNING, timeout=20, what="running", log=worker.log)
    assert verbs(vm) == ["vm.request", "vm.provisioning", "vm.running"]
    assert_running_exactly_once(vm)
    vm.refresh_from_db()
    assert vm.node.hostname == "a100-001"
    assert sim.status(vm.instance_id, "a100-001").ip_address == vm.ip_address


def test_a_worker_killed_mid_provision_leaves_the_vm_to_the_reconciler_which_finishes_it_once(
    workers, standalone_pool, boot_in, tenant, sim, celery_queue
):
    boot_in(4)  # a slow boot: the provision task is polling when the kill lands
    first = workers()
    vm = request(tenant, standalone_pool, "train-2", gpu_count=2)

    def booting():
        vm.refresh_from_db()
        return vm.node_id and sim.status(vm.instance_id, vm.node.hostname).state == "booting"

    wait_for(booting, timeout=20, what="the VM to be booting", log=first.log)
    first.kill()

    # The kill took the in-flight provision with it: its message stays unacknowledged until the
    # broker's visibility timeout (an hour), so no worker will record the boot.
    # (A debounced plans.replan the placement sent may be held there too: not the VM's work.)
    lost = queue_in_flight(celery_queue)
    held = {m["headers"]["task"] for m in lost.values()}
    assert {name for name in held if not name.startswith("plans.")} == {"rentals.vm_provision"}
    assert state_of(vm) == State.PROVISIONING

    second = workers()

    def reconciled_and_running() -> bool:
        vms_reconcile(grace_seconds=1)  # what beat runs every 30 s
        return state_of(vm) == State.RUNNING

    wait_for(reconciled_and_running, timeout=25, what="the reconciler", log=second.log)
    assert_running_exactly_once(vm)
    if not any(tag.startswith("waiting-") for tag in lost):
        # (If the kill caught the task's next poll in the instant it sat in the queue, the new
        # worker may have finished the work itself instead, which is just as correct.)
        assert verbs(vm).count("vm.reconcile") == 1

    # The lost message coming back after the visibility timeout changes nothing.
    app.send_task("rentals.vm_provision", args=[vm.pk])
    wait_for(lambda: idle(celery_queue, set(lost)), timeout=15, what="idle", log=second.log)
    assert_running_exactly_once(vm)


def test_a_provision_task_that_never_ran_is_sent_again_by_the_reconciler(
    workers, boot_in, vm_in, sim, celery_queue
):
    vm = vm_in("provisioning", gpus=(0, 1))  # sent with no worker up...
    sent = [m["headers"]["task"] for m in queue_in_flight(celery_queue).values()]
    assert [name for name in sent if not name.startswith("plans.")] == ["rentals.vm_provision"]
    queue_purge(celery_queue)  # ...and lost
    worker = workers()

    vms_reconcile(grace_seconds=0)

    wait_for(lambda: state_of(vm) == State.RUNNING, timeout=20, what="running", log=worker.log)
    assert_running_exactly_once(vm)


def test_a_duplicated_provision_task_changes_nothing_the_second_time(
    workers, boot_in, vm_in, sim, celery_queue
):
    worker = workers()
    vm = vm_in("provisioning", gpus=(0, 1, 2, 3))  # sends rentals.vm_provision on commit
    app.send_task("rentals.vm_provision", args=[vm.pk])  # and the same task once more

    wait_for(lambda: state_of(vm) == State.RUNNING, timeout=20, what="running", log=worker.log)
    wait_for(lambda: idle(celery_queue), timeout=15, what="both tasks done", log=worker.log)
    assert_running_exactly_once(vm)
    received = re.findall(r"Task rentals\.vm_provision\[([0-9a-f-]+)\] received", worker.log())
    assert len(set(received)) == 2


def test_a_driver_failing_twice_then_answering_ends_running(
    workers, fleet_east, boot_in, vm_in, sim
):
    worker = workers()
    vm = vm_in("pending")
    sim.failure_inject(
        "create", "libvirtd is restarting", times=2, transient=True, instance_id=vm.instance_id
    )

    vm = services.vm_place(vm=vm, node=fleet_east["nodes"]["h100-001"], gpu_indices=[0])

    wait_for(lambda: state_of(vm) == State.RUNNING, timeout=20, what="running", log=worker.log)
    assert_running_exactly_once(vm)
    assert worker.log().count("libvirtd is restarting") >= 2


def test_a_permanent_driver_failure_ends_failed_with_its_message_and_frees_the_gpus(
    workers, fleet_east, vm_in, sim
):
    worker = workers()
    vm = vm_in("pending")
    sim.failure_inject(
        "create", "IOMMU group 42 is not viable", instance_id=vm.instance_id, times=None
    )

    services.vm_place(vm=vm, node=fleet_east["nodes"]["h100-001"], gpu_indices=[5])

    wait_for(lambda: state_of(vm) == State.FAILED, timeout=20, what="failed", log=worker.log)
    vm.refresh_from_db()
    assert vm.failure_reason == "IOMMU group 42 is not viable"
    assert not Allocation.objects.filter(vm=vm, released_at=None).exists()
    assert not UsageInterval.objects.filter(vm=vm, ended_at=None).exists()
    assert sim.status(vm.instance_id, "h100-001").state == "missing"
