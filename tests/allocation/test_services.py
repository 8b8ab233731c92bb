"""Setting and removing quotas: validation naming the field with nothing changed, the note when
a quota is lowered below use, the audit, and the plans made again."""

import pytest
from django.core.exceptions import ValidationError

from gpucap.allocation import services as allocation
from gpucap.allocation.models import TenantQuota
from gpucap.allocation.selectors import HELD_STATES, PENDING_STATE
from gpucap.audit.models import AuditEvent
from gpucap.fleet.models import CapacitySet
from gpucap.rentals.services import HOLDING, State
from tests.rentals.vm_helpers import request_vm, running_vm


def _generations() -> dict[str, int]:
    return dict(CapacitySet.objects.values_list("name", "generation"))


def test_the_use_counted_is_what_the_rentals_call_holding():
    assert set(HELD_STATES) == set(HOLDING)
    assert PENDING_STATE == State.PENDING


@pytest.mark.parametrize(
    "given, field",
    [
        ({"max_gpus": -1}, "max_gpus"),
        ({"max_gpus": "8"}, "max_gpus"),
        ({"max_gpus": True}, "max_gpus"),
        ({"max_gpus": 8, "max_pending": -2}, "max_pending"),
        ({"max_gpus": 8, "pool": None, "gpu_model": ""}, "pool"),
        ({"max_gpus": 8, "gpu_model": "H100-SXM5-80GB"}, "gpu_model"),
        ({"max_gpus": 8, "pool": None, "gpu_model": "B200"}, "gpu_model"),
        ({"max_gpus": 8, "pool": "h100-spot"}, "pool"),  # a name, not a pool
    ],
)
def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
    tenant, pools, operator, given, field
):
    given = {"pool": pools["h100-spot"], **given}
    before = (_generations(), AuditEvent.objects.count())
    with pytest.raises(ValidationError) as refused:
        allocation.quota_set(tenant=tenant, actor=operator, **given)
    assert field in refused.value.message_dict
    assert not TenantQuota.objects.exists()
    assert (_generations(), AuditEvent.objects.count()) == before


def test_an_unknown_gpu_model_is_refused_with_the_known_ones(tenant, pools, operator):
    with pytest.raises(ValidationError) as refused:
        allocation.quota_set(tenant=tenant, gpu_model="B200", max_gpus=8, actor=operator)
    assert (
        "known: A100-SXM4-80GB, H100-SXM5-80GB, L40S" in refused.value.message_dict["gpu_model"][0]
    )


def test_a_pool_quota_bumps_its_set_and_is_audited(tenant, pools, operator):
    before = _generations()
    saved = allocation.quota_set(
        tenant=tenant, pool=pools["h100-spot"], max_gpus=16, max_pending=4, actor=operator
    )
    after = _generations()
    assert saved.created and saved.note == ""
    assert after["h100-east"] == before["h100-east"] + 1
    assert after["l40s-east"] == before["l40s-east"]
    event = AuditEvent.objects.get(verb="quota.set")
    assert event.after["max_gpus"] == 16 and event.after["pool"] == "h100-spot"
    assert event.actor == operator


def test_setting_the_same_quota_again_changes_nothing(tenant, pools, operator, quota):
    quota(16)
    before = (_generations(), AuditEvent.objects.count())
    saved = quota(16)
    assert not saved.created
    assert (_generations(), AuditEvent.objects.count()) == before
    assert TenantQuota.objects.count() == 1


def test_a_model_quota_bumps_every_set_of_that_model(tenant, pools, operator, fleet_east):
    from gpucap.fleet import services as fleet

    west = fleet.capacity_set_create(
        cluster=fleet_east["cluster"],
        name="h100-west",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
    )
    before = _generations()
    allocation.quota_set(tenant=tenant, gpu_model="H100-SXM5-80GB", max_gpus=16, actor=operator)
    after = _generations()
    assert after["h100-east"] == before["h100-east"] + 1
    assert after[west.name] == before[west.name] + 1
    assert after["l40s-east"] == before["l40s-east"]


def test_lowering_a_quota_below_use_stops_nothing_and_says_so(
    tenant, pools, operator, fleet_east, quota
):
    nodes = fleet_east["nodes"]
    for n, gpus in enumerate(([0, 1, 2, 3], [4, 5, 6, 7]), start=1):
        running_vm(
            tenant,
            pools["h100-spot"],
            nodes["h100-001"],
            gpus,
            name=f"train-{n}",
            ip=f"10.60.0.{n}",
        )
    saved = quota(4)
    assert saved.note == (
        "acme holds 8 GPUs in pool h100-spot (train-1, train-2), over the new quota of 4: "
        "nothing is stopped; new requests are refused until it is below"
    )
    assert set(tenant.vms.values_list("state", flat=True)) == {State.RUNNING}


def test_deleting_a_quota_bumps_its_set_and_is_audited(tenant, pools, operator, quota):
    saved = quota(16)
    before = _generations()
    allocation.quota_delete(quota=saved.quota, actor=operator)
    allocation.quota_delete(quota=saved.quota, actor=operator)  # harmless the second time
    assert not TenantQuota.objects.exists()
    assert _generations()["h100-east"] == before["h100-east"] + 1
    assert AuditEvent.objects.filter(verb="quota.delete").count() == 1


def test_pending_requests_count_in_the_use(tenant, pools, quota):
    request_vm(tenant, pools["h100-spot"], name="waits", gpu_count=2)
    saved = quota(8)
    assert (saved.use.held_gpus, saved.use.pending_gpus, saved.use.pending_vms) == (
        0,
        2,
        ["waits"],
    )
