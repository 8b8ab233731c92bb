"""Inference follows the VM lifecycle (``vm_transitioned``, gpucap/rentals/signals.py): the
router sends only to running replicas whose readiness probe answered, so a replica's move
republishes its deployment's route, and a replica whose guest goes down forgets its probes (when
it runs again it waits for a fresh one)."""

from gpucap.inference import services
from gpucap.inference.cache import route_publish_on_commit
from gpucap.rentals.models import VirtualMachine

State = VirtualMachine.State
# The states in which a replica's guest (and so its model server) is up.
GUEST_UP = (State.RUNNING, State.NOTIFIED)


def inference_follow_vm(sender, *, vm, old, new, **kwargs) -> None:
    if vm.deployment_id is None:
        return
    if old in GUEST_UP and new not in GUEST_UP:
        services.replica_probe_forget(vm=vm)
    route_publish_on_commit(vm.deployment_id)
