"""Usage follows the VM lifecycle (``vm_transitioned``, gpucap/rentals/signals.py): every
interval during which a VM holds GPUs becomes a usage interval (DESIGN.md section 9)."""

from gpucap.rentals.services import HOLDING
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
        )
    elif old in HOLDING and new not in HOLDING:
        UsageInterval.objects.filter(vm=vm, ended_at=None).update(ended_at=now)
