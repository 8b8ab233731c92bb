"""Plans follow the VM lifecycle (``vm_transitioned``, gpucap/rentals/signals.py): a VM's move
changes demand or free capacity, so its capacity set's generation is bumped (DESIGN.md section
8) and a prompt replan asked for."""

from gpucap.fleet.models import Pool
from gpucap.fleet.services import capacity_set_bump


def plans_follow_vm(sender, *, vm, **kwargs) -> None:
    capacity_set_id = Pool.objects.filter(pk=vm.pool_id).values_list("capacity_set_id", flat=True)
    capacity_set_bump(capacity_set_id=capacity_set_id.first())
