"""A failed card's VMs (docs/bmc.md, Discovery's last paragraph): when a GPU's health becomes
failed, however it is set, every running VM holding it gets a drain notice and is stopped at the
deadline, on-demand VMs included; VMs on the node's other cards run on; a signal delivered twice
sends no second notice; a VM still booting on the card is warned by the sweep once it runs."""

from datetime import timedelta

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Gpu, Pool
from gpucap.fleet.signals import gpu_failed
from gpucap.notices import drains, services, tasks
from gpucap.notices.models import InterruptionNotice
from gpucap.rentals import services as rentals
from gpucap.rentals.models import Allocation, VirtualMachine
from tests.rentals.conftest import SSH_KEY, wait_for

State = VirtualMachine.State
Reason = InterruptionNotice.Reason


def gpu_of(node, index: int) -> Gpu:
    return Gpu.objects.get(node=node, index=index)


def state_of(vm: VirtualMachine) -> str:
    return VirtualMachine.objects.values_list("state", flat=True).get(pk=vm.pk)


def notices_of(vm: VirtualMachine) -> list[InterruptionNotice]:
    return list(InterruptionNotice.objects.filter(vm=vm))


@pytest.fixture
def h100(fleet_east, vm_in, sent_tasks):
    """h100-001 with a spot VM on GPU 0, an on-demand VM on GPU 2 and a spot VM on GPUs 4-7."""
    return {
        "node": fleet_east["nodes"]["h100-001"],
        "spot": vm_in("running", pool="h100-spot", gpus=(0,)),
        "on_demand": vm_in("running", pool="h100-ondemand", gpus=(2,)),
        "wide": vm_in("running", pool="h100-spot", gpus=(4, 5, 6, 7)),
    }


def test_the_vm_on_a_failed_card_gets_a_drain_notice_even_on_demand(h100, operator):
    fleet.gpu_set_health(gpu=gpu_of(h100["node"], 2), health="failed", actor=operator)

    on_demand = VirtualMachine.objects.get(pk=h100["on_demand"].pk)
    assert on_demand.state == State.NOTIFIED
    [notice] = notices_of(on_demand)
    assert notice.reason == Reason.DRAIN
    assert notice.message == ("GPU 2 of node h100-001 failed: the VM is stopped at the deadline")
    assert notice.deadline - notice.issued_at == timedelta(seconds=120)  # the set's
    assert notice.issued_by == operator
    # The node's other cards are fine: their VMs run on, warned of nothing.
    for kind in ("spot", "wide"):
        assert state_of(h100[kind]) == State.RUNNING, kind
        assert notices_of(h100[kind]) == [], kind


def test_a_vm_holding_several_cards_is_warned_when_one_of_them_fails(h100):
    fleet.gpu_set_health(gpu=gpu_of(h100["node"], 5), health="failed")

    assert state_of(h100["wide"]) == State.NOTIFIED
    [notice] = notices_of(h100["wide"])
    assert notice.issued_by is None  # the system (discovery, a BMC's word)
    assert "GPU 5 of node h100-001 failed" in notice.message


def test_the_vm_is_stopped_at_its_deadline_and_lets_go_of_the_card(h100):
    fleet.gpu_set_health(gpu=gpu_of(h100["node"], 2), health="failed")
    notice = InterruptionNotice.objects.get(vm=h100["on_demand"])

    tasks.deadline_stop(notice.pk)  # early: nothing happens
    assert state_of(h100["on_demand"]) == State.NOTIFIED
    assert services.notice_deadline_reached(notice=notice, now=notice.deadline) is True
    rentals.vm_mark_stopped(vm=h100["on_demand"])  # what the stop task reports

    assert state_of(h100["on_demand"]) == State.STOPPED  # on-demand: stopped, not resumed
    assert not Allocation.objects.filter(vm=h100["on_demand"], released_at=None).exists()


def test_a_signal_delivered_twice_sends_one_notice_per_vm(h100):
    gpu = gpu_of(h100["node"], 5)
    fleet.gpu_set_health(gpu=gpu, health="failed")

    gpu_failed.send(sender=Gpu, gpu_id=gpu.pk, node_id=gpu.node_id, actor=None)  # a retry
    drains.gpu_failed_warn(gpu_id=gpu.pk)
    fleet.gpu_set_health(gpu=gpu, health="failed")  # told again: no change, no signal
    drains.gpu_failed_sweep()

    assert len(notices_of(h100["wide"])) == 1
    issued = AuditEvent.objects.filter(verb="notice.drain", object_id=str(h100["wide"].pk))
    assert issued.count() == 1


def test_a_late_signal_for_a_card_healed_since_warns_nobody(h100):
    gpu = gpu_of(h100["node"], 0)  # ok again by the time the warning runs

    assert drains.gpu_failed_warn(gpu_id=gpu.pk) == []
    assert state_of(h100["spot"]) == State.RUNNING
    assert not InterruptionNotice.objects.exists()


def test_a_card_set_ok_warns_nobody(fleet_east, h100):
    gpu = gpu_of(h100["node"], 1)  # no VM holds it
    fleet.gpu_set_health(gpu=gpu, health="failed")
    fleet.gpu_set_health(gpu=gpu, health="ok")

    assert not InterruptionNotice.objects.exists()
    assert all(state_of(h100[kind]) == State.RUNNING for kind in ("spot", "on_demand", "wide"))


def test_a_vm_booting_on_the_card_is_warned_by_the_sweep_once_it_runs(
    fleet_east, vm_in, sent_tasks
):
    booting = vm_in("provisioning", pool="h100-ondemand", gpus=(3,))
    fleet.gpu_set_health(gpu=gpu_of(fleet_east["nodes"]["h100-001"], 3), health="failed")
    assert state_of(booting) == State.PROVISIONING  # no guest yet to warn
    assert notices_of(booting) == []

    rentals.vm_mark_running(vm=booting, ip_address="10.200.0.30")
    tasks.sweep()

    assert state_of(booting) == State.NOTIFIED
    [notice] = notices_of(booting)
    assert "GPU 3 of node h100-001 failed" in notice.message
    tasks.sweep()
    assert len(notices_of(booting)) == 1


def test_a_vm_with_an_open_notice_keeps_it_and_its_deadline(h100):
    earlier = services.notice_issue(vm=h100["on_demand"], reason=Reason.RECLAIM, seconds=600)

    fleet.gpu_set_health(gpu=gpu_of(h100["node"], 2), health="failed")

    assert notices_of(h100["on_demand"]) == [earlier]


# --- through a real worker and the simulated fleet ------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_stops_the_vm_on_a_failed_card_at_its_deadline(
    workers, fleet_east, tenant, sim
):
    """The whole path: the VM is booted by the worker on the simulated fleet; its card fails;
    the deadline task and the driver's stop run in the worker; the VM ends stopped, off in the
    simulated fleet, its card let go."""
    cluster = fleet_east["cluster"]
    cluster.driver_settings = {"boot_seconds": 0.5}
    cluster.save(update_fields=["driver_settings"])
    pool = fleet_east["pools"]["a100-standalone"]
    Pool.objects.filter(pk=pool.pk).update(notice_seconds=1)
    fleet.pool_set_tenants(pool=pool, tenants=[tenant])
    worker = workers()
    vm = rentals.vm_request(
        tenant=tenant,
        pool=pool,
        name="train-1",
        gpu_count=1,
        image="ubuntu-24.04-cuda-12.6",
        ssh_public_key=SSH_KEY,
    )
    wait_for(lambda: state_of(vm) == State.RUNNING, timeout=30, what="running", log=worker.log)
    vm.refresh_from_db()
    card = Allocation.objects.get(vm=vm, released_at=None).gpu

    fleet.gpu_set_health(gpu=card, health="failed")

    assert state_of(vm) == State.NOTIFIED
    wait_for(lambda: state_of(vm) == State.STOPPED, timeout=60, what="stopped", log=worker.log)
    assert sim.status(vm.instance_id, vm.node.hostname).state == "stopped"
    assert not Allocation.objects.filter(vm=vm, released_at=None).exists()
    notice = InterruptionNotice.objects.get(vm=vm)
    assert notice.outcome == InterruptionNotice.Outcome.DEADLINE
    assert notice.completed_at >= notice.deadline
