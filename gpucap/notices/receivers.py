"""Notices follow the VM lifecycle (``vm_transitioned``, gpucap/rentals/signals.py): an open
notice ends when its VM lets go of its GPUs, a draining node may then end cordoned, and the
guest's metadata document shows the VM as it is now. A guest the reconciler saw power off
before its deadline (``guest_shut_down_early``) ends its notice as ``guest_shutdown``. A card
that failed (the fleet's ``gpu_failed``) has its VMs warned and stopped at the deadline."""

from gpucap.notices.cache import metadata_publish_on_commit
from gpucap.notices.drains import gpu_failed_warn, node_drain_finish
from gpucap.notices.models import InterruptionNotice
from gpucap.notices.services import notice_guest_shutdown
from gpucap.rentals.services import HOLDING
from gpucap.tasks import on_commit


def notice_ends_as_guest_shutdown(sender, *, vm, **kwargs) -> None:
    notice_guest_shutdown(vm=vm)


def notices_follow_failed_gpu(sender, *, gpu_id: int, actor=None, **kwargs) -> None:
    gpu_failed_warn(gpu_id=gpu_id, actor=actor)


def notices_follow_vm(sender, *, vm, old: str, new: str, now, node_id, **kwargs) -> None:
    if old in HOLDING and new not in HOLDING:
        _notices_end(vm, at=now)
        _node_freed(node_id)
    metadata_publish_on_commit(vm.pk)


def _notices_end(vm, *, at) -> None:
    """An open notice ends when the VM stops holding its GPUs, however that came about."""
    InterruptionNotice.objects.filter(vm=vm, completed_at=None, outcome="").update(
        completed_at=at, outcome=InterruptionNotice.Outcome.ENDED
    )
    InterruptionNotice.objects.filter(vm=vm, completed_at=None).update(completed_at=at)


def _node_freed(node_id: int | None) -> None:
    """A draining node ends cordoned once its last VM let go (gpucap.notices.drains). Checked
    after commit, under the node's lock, so two VMs leaving at once cannot both miss it."""
    if node_id is not None:
        on_commit(lambda: node_drain_finish(node_id=node_id), what="node drain finish")
