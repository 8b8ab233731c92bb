"""Plans follow the fleet and the VM lifecycle:

- ``capacity_set_changed`` (gpucap/fleet/signals.py): a set's generation was bumped, so a
  prompt, debounced replan is asked for (DESIGN.md section 8);
- ``vm_transitioned`` (gpucap/rentals/signals.py): a VM's move changes demand or free capacity,
  so its capacity set's generation is bumped (which asks for the replan in turn)."""

from gpucap.fleet.models import Pool
from gpucap.fleet.services import capacity_set_bump
from gpucap.plans.triggers import replan_soon


def plans_follow_set(sender, *, capacity_set_id: int, **kwargs) -> None:
    replan_soon(capacity_set_id)


def plans_follow_vm(sender, *, vm, **kwargs) -> None:
    capacity_set_id = Pool.objects.filter(pk=vm.pool_id).values_list("capacity_set_id", flat=True)
    capacity_set_bump(capacity_set_id=capacity_set_id.first())
