"""A VM whose host was lost: an operator marks its node down (or the reconciler finds it gone,
tests/rentals/test_reconcile.py). A spot VM goes back to pending with the reason, its GPUs
released, and resumes elsewhere on a fresh disk; an on-demand VM is failed with the reason, and
the operator sees why in the audit log and the VM listing."""

from django.urls import reverse

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Node
from gpucap.rentals import services
from gpucap.rentals.models import Allocation, VirtualMachine

State = VirtualMachine.State


def live_gpus(vm: VirtualMachine) -> list[int]:
    return sorted(
        Allocation.objects.filter(vm=vm, released_at=None).values_list("gpu__index", flat=True)
    )


def test_marking_a_node_down_sends_spot_vms_back_to_pending_and_fails_the_rest(
    vm_in, fleet_east, operator, operator_client
):
    spot = vm_in("running", pool="h100-spot", gpus=(0,))
    notified = vm_in("notified", pool="h100-spot", gpus=(1,))
    on_demand = vm_in("running", pool="h100-ondemand", gpus=(2, 3))
    elsewhere = vm_in("running", pool="h100-ondemand", node="h100-002", gpus=(0,))

    fleet.node_set_state(
        node=fleet_east["nodes"]["h100-001"],
        state=Node.State.DOWN,
        actor=operator,
        message="PSU failure",
    )

    reason = "its host h100-001 was lost: an operator marked it down (PSU failure)"
    for vm in (spot, notified):
        vm.refresh_from_db()
        assert (vm.state, vm.failure_reason) == (State.PENDING, reason)
        assert live_gpus(vm) == []
        assert vm.disk_node_id is None, "its disk went with the host"
        event = AuditEvent.objects.get(verb="vm.pending", object_id=str(vm.pk))
        assert event.message.endswith(
            "resumes elsewhere on a fresh disk from ubuntu-24.04-cuda-12.6"
        )
    on_demand.refresh_from_db()
    assert (on_demand.state, on_demand.failure_reason) == (State.FAILED, reason)
    assert live_gpus(on_demand) == []
    assert AuditEvent.objects.get(verb="vm.failed", object_id=str(on_demand.pk)).message == reason
    elsewhere.refresh_from_db()
    assert elsewhere.state == State.RUNNING

    # The operator's VM listing says why, next to each VM's state.
    page = operator_client.get(reverse("rentals:vm-list")).content.decode()
    assert page.count(reason) >= 3


def test_a_vm_being_terminated_on_a_lost_host_ends_terminated(vm_in, fleet_east):
    vm = vm_in("running", pool="h100-spot", gpus=(0,))
    services.vm_terminate(vm=vm)
    fleet.node_set_state(node=fleet_east["nodes"]["h100-001"], state=Node.State.DOWN)
    vm.refresh_from_db()
    assert vm.state == State.TERMINATED


def test_a_lost_host_is_handled_once(vm_in, fleet_east):
    vm = vm_in("running", pool="h100-spot", gpus=(0,))
    services.vm_host_lost(vm=vm, reason="gone")
    services.vm_host_lost(vm=vm, reason="gone again")
    vm.refresh_from_db()
    assert vm.failure_reason == "its host h100-001 was lost: gone"
    assert AuditEvent.objects.filter(verb="vm.pending", object_id=str(vm.pk)).count() == 1


def test_a_spot_vm_that_lost_its_host_is_placed_on_a_fresh_disk(vm_in, fleet_east, sent_tasks):
    from django.db import transaction

    vm = vm_in("running", pool="h100-spot", gpus=(0,))
    services.vm_host_lost(vm=vm, reason="gone")
    with transaction.atomic():
        services.vm_place(vm=vm, node=fleet_east["nodes"]["h100-002"], gpu_indices=[0])
    vm.refresh_from_db()
    assert vm.failure_reason == ""
    event = AuditEvent.objects.filter(verb="vm.provisioning", object_id=str(vm.pk)).latest("pk")
    assert event.message == "resumed on a fresh disk from ubuntu-24.04-cuda-12.6"


def test_a_reclaimed_spot_vm_placed_back_on_its_node_resumes_on_its_disk(vm_in, fleet_east):
    vm = vm_in("running", pool="h100-spot", node="h100-002", gpus=(0,))
    services.vm_stop_for_notice(vm=vm)
    vm = services.vm_mark_stopped(vm=vm)
    assert vm.state == State.PENDING and vm.disk_node_id == fleet_east["nodes"]["h100-002"].pk

    services.vm_place(vm=vm, node=fleet_east["nodes"]["h100-002"], gpu_indices=[0], message="plan")

    event = AuditEvent.objects.filter(verb="vm.provisioning", object_id=str(vm.pk)).latest("pk")
    assert event.message == "plan; resumed on its disk on h100-002"
