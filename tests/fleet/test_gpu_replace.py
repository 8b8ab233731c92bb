"""A card swapped in place (``gpu_replace``): its new UUID, only while no VM holds it."""

import pytest
from django.core.exceptions import ValidationError

from gpucap.audit.models import AuditEvent
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Gpu
from tests.rentals.vm_helpers import grant_pools, running_vm

NEW_UUID = "GPU-0b5e55ed-0000-4000-8000-00000000003a"


def test_a_free_card_gets_its_new_uuid_audited(fleet_east, operator):
    gpu = fleet_east["nodes"]["h100-001"].gpus.get(index=2)
    before = gpu.uuid

    fleet.gpu_replace(gpu=gpu, uuid=NEW_UUID, actor=operator)

    gpu.refresh_from_db()
    assert gpu.uuid == NEW_UUID
    event = AuditEvent.objects.get(verb="gpu.replace")
    assert (event.before, event.after, event.actor) == (
        {"uuid": before},
        {"uuid": NEW_UUID},
        operator,
    )


def test_a_card_a_vm_holds_is_not_replaced(fleet_east, tenant, other_tenant):
    pools = grant_pools(fleet_east, tenant, other_tenant)
    node = fleet_east["nodes"]["a100-001"]
    running_vm(tenant, pools["a100-standalone"], node, [2], name="train", ip="10.9.0.2")
    gpu = node.gpus.get(index=2)

    with pytest.raises(Conflict, match="GPU 2 of a100-001 is held by a VM"):
        fleet.gpu_replace(gpu=gpu, uuid=NEW_UUID)

    assert Gpu.objects.get(pk=gpu.pk).uuid != NEW_UUID


def test_a_uuid_of_another_card_is_refused(fleet_east):
    nodes = fleet_east["nodes"]
    taken = nodes["h100-002"].gpus.get(index=0).uuid

    with pytest.raises(ValidationError) as caught:
        fleet.gpu_replace(gpu=nodes["h100-001"].gpus.get(index=2), uuid=taken)

    assert caught.value.message_dict == {
        "uuid": [f"{taken} is registered already, as GPU 0 of h100-002"]
    }
