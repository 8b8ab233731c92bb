"""Usage follows the VM lifecycle (``vm_transitioned``, gpucap/rentals/signals.py): every
interval during which a VM holds GPUs becomes a usage interval (DESIGN.md section 9), opened with
the VM's attribution (gpucap/usage/attribution.py). Usage also follows what changes an
attribution without moving the VM: a node dedicated or released (``node_dedication_changed``,
gpucap/fleet/signals.py) and a reservation deleted. A whole machine rented to a tenant is usage
too (``bare_metal_rental_changed``, gpucap/bmc/signals.py): all its GPUs, held from the rental's
start to its end."""

from django.db.models import Q
from django.utils import timezone

from gpucap.bmc.models import BareMetalRental
from gpucap.rentals.models import VirtualMachine
from gpucap.rentals.services import HOLDING
from gpucap.usage import services
from gpucap.usage.attribution import Attribution, reservation_ref, vm_attribution
from gpucap.usage.models import BARE_METAL, Allocation, UsageInterval


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


def usage_follow_bare_metal(sender, *, rental: BareMetalRental, **kwargs) -> None:
    """A rental started: its interval opens at its start, the node's GPU count held, ``dedicated``
    to the node (the machine is its tenant's alone). It ended: the interval ends with it. Told
    twice, it changes nothing: a rental has one interval (a unique constraint; a second insert
    does nothing), and only an open one is ended."""
    if rental.ended_at is None:
        node = rental.node
        attribution = Attribution(allocation=Allocation.DEDICATED, dedicated_node=node.hostname)
        UsageInterval.objects.bulk_create(
            [
                UsageInterval(
                    tenant_id=rental.tenant_id,
                    bare_metal_rental=rental,
                    pool_kind=BARE_METAL,
                    gpu_model=node.gpu_model,
                    gpu_count=node.gpu_count,
                    started_at=rental.started_at,
                    **attribution.fields(),
                )
            ],
            ignore_conflicts=True,
        )
    else:
        UsageInterval.objects.filter(bare_metal_rental=rental, ended_at=None).update(
            ended_at=rental.ended_at
        )
