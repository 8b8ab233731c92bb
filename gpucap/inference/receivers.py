"""Inference follows the VM lifecycle (``vm_transitioned``, gpucap/rentals/signals.py): the
router sends only to running replicas, so a replica's move republishes its deployment's route."""

from gpucap.inference.cache import route_publish_on_commit


def inference_follow_vm(sender, *, vm, **kwargs) -> None:
    if vm.deployment_id is not None:
        route_publish_on_commit(vm.deployment_id)
