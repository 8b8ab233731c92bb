"""A card swapped in place: the same slot and PCI address, a new GPU (docs/bmc.md, Discovery).

The fleet file refuses a UUID change in place (a typo must not rename a card); the BMC's
discovery is how a real swap is recorded, and only while no VM holds the card."""

from django.core.exceptions import ValidationError
from django.db import transaction

from gpucap.audit.services import Actor, audit_record
from gpucap.errors import Conflict
from gpucap.fleet.models import Gpu
from gpucap.fleet.services._common import capacity_set_bump


@transaction.atomic
def gpu_replace(*, gpu: Gpu, uuid: str, actor: Actor = None) -> Gpu:
    """Give the card at ``gpu``'s place its new UUID. Refused (409) while a VM holds it;
    ``uuid`` must be free across the fleet."""
    gpu = Gpu.objects.select_for_update(no_key=True).select_related("node").get(pk=gpu.pk)
    if gpu.uuid == uuid:
        return gpu
    if not isinstance(uuid, str) or not uuid.strip() or len(uuid) > 64:
        raise ValidationError({"uuid": "must be 1 to 64 characters"})
    other = Gpu.objects.filter(uuid=uuid).exclude(pk=gpu.pk).select_related("node").first()
    if other is not None:
        raise ValidationError(
            {"uuid": f"{uuid} is registered already, as GPU {other.index} of {other.node}"}
        )
    if gpu.allocations.filter(released_at__isnull=True).exists():
        raise Conflict(
            f"GPU {gpu.index} of {gpu.node.hostname} is held by a VM; it can be replaced only "
            "when none holds it (drain the node first)",
            code="gpu_busy",
        )
    before = gpu.uuid
    gpu.uuid = uuid
    gpu.save(update_fields=["uuid"])
    capacity_set_bump(capacity_set_id=gpu.node.capacity_set_id)
    audit_record(
        actor=actor, verb="gpu.replace", target=gpu, before={"uuid": before}, after={"uuid": uuid}
    )
    return gpu
