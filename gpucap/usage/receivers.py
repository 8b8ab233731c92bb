"""Usage follows the VM lifecycle (``vm_transitioned``, gpucap/rentals/signals.py): every
interval during which a VM holds GPUs becomes a usage interval (DESIGN.md section 9), opened with
the VM's attribution (gpucap/usage/attribution.py). Usage also follows what changes an
attribution without moving the VM: a node dedicated or released (``node_dedication_changed``,
gpucap/fleet/signals.py) and a reservation deleted."""

from django.db.models import Q
from django.utils import timezone

from gpucap.rentals.models import VirtualMachine
from gpucap.rentals.services import HOLDING
from gpucap.usage import services
from gpucap.usage.attribution import reservation_ref, vm_attribution
from gpucap.usage.models import UsageInterval


def usage_follow_vm(sender, *, vm, old: str, new: str, now, **kwargs) -> None:
    """Open an interval when a VM takes GPUs; close it when the VM lets them go."""
    if old not in HOLDING and new in HOLDING:
        UsageInterval.objects.create(
            tenant_id=vm.tenant_id,
            vm=vm,
            pool_kind=vm.pool.kind,
            gpu_model=vm.node.gpu_model,
            gpu_count=vm.gpu_count,
            started_at=now,
            **vm_attribution(vm).fields(),
        )
    elif old in HOLDING and new not in HOLDING:
        UsageInterval.objects.filter(vm=vm, ended_at=None).update(ended_at=now)


def usage_follow_dedication(sender, *, node_id: int, **kwargs) -> None:
    """A node was dedicated or released: its tenant's VMs there change attribution now."""
    vm_ids = VirtualMachine.objects.filter(node_id=node_id, state__in=HOLDING).values_list(
        "pk", flat=True
    )
    services.usage_reattribute(vm_ids=list(vm_ids), now=timezone.now())


def usage_follow_reservation_deleted(sender, *, instance, **kwargs) -> None:
    """A reservation was deleted (its VMs' ``reservation`` and ``borrowed_from`` set null in the
    same delete): the VMs inside it or borrowing from it change attribution now."""
    ref = reservation_ref(instance.pk)
    vm_ids = UsageInterval.objects.filter(
        Q(commitment_id=ref) | Q(borrowed_from=ref), ended_at=None
    ).values_list("vm_id", flat=True)
    services.usage_reattribute(vm_ids=list(vm_ids), now=timezone.now())
