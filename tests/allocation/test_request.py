"""A request past a quota is refused at once, naming the quota, the use and the VMs that hold
it; nothing changes. Inference replicas are not refused at request time (the arbiter keeps
them within the quota, see test_planning.py)."""

import pytest
from django.core.exceptions import ValidationError

from gpucap.rentals.jobs import job_request
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import IMAGE, SSH_KEY, request_vm, running_vm, world


@pytest.fixture
def holding(tenant, pools, fleet_east):
    """acme holds 12 GPUs in h100-spot: train-1 (4), train-2 (4) and spot-3 (4)."""
    nodes = fleet_east["nodes"]
    for n, (name, node, gpus) in enumerate(
        [
            ("train-1", "h100-001", [0, 1, 2, 3]),
            ("train-2", "h100-001", [4, 5, 6, 7]),
            ("spot-3", "h100-002", [0, 1, 2, 3]),
        ],
        start=1,
    ):
        running_vm(tenant, pools["h100-spot"], nodes[node], gpus, name=name, ip=f"10.61.0.{n}")


def test_a_request_past_a_pool_quota_is_refused_naming_the_vms(tenant, pools, holding, quota):
    quota(16)
    before = world()
    with pytest.raises(ValidationError) as refused:
        request_vm(tenant, pools["h100-spot"], name="big", gpu_count=8)
    assert refused.value.message_dict == {
        "gpu_count": [
            "over acme's quota in pool h100-spot: 16 GPUs; acme holds 12 (spot-3, train-1, "
            "train-2) and asks for 8"
        ]
    }
    assert world() == before


def test_a_request_within_the_quota_is_taken(tenant, pools, holding, quota):
    quota(16)
    vm = request_vm(tenant, pools["h100-spot"], name="small", gpu_count=4)
    assert vm.state == VirtualMachine.State.PENDING


def test_pending_requests_count_toward_the_quota(tenant, pools, quota):
    quota(8)
    request_vm(tenant, pools["h100-spot"], name="first", gpu_count=4)
    request_vm(tenant, pools["h100-spot"], name="second", gpu_count=4)
    with pytest.raises(ValidationError) as refused:
        request_vm(tenant, pools["h100-spot"], name="third", gpu_count=1)
    assert refused.value.message_dict["gpu_count"] == [
        "over acme's quota in pool h100-spot: 8 GPUs; acme holds 0, has 8 pending (first, "
        "second) and asks for 1"
    ]


def test_a_model_quota_counts_every_pool_of_the_model(tenant, pools, holding, quota):
    quota(14, pool=None, gpu_model="H100-SXM5-80GB")
    with pytest.raises(ValidationError) as refused:
        request_vm(tenant, pools["h100-spot"], name="more", gpu_count=4)
    assert refused.value.message_dict["gpu_count"][0].startswith(
        "over acme's quota on H100-SXM5-80GB GPUs: 14 GPUs; acme holds 12"
    )
    # Another model is not bound by it.
    request_vm(tenant, pools["l40s-ondemand"], name="elsewhere", gpu_count=1)


def test_a_quota_of_pending_requests_refuses_one_more(tenant, pools, quota):
    quota(64, max_pending=1)
    request_vm(tenant, pools["h100-spot"], name="waits", gpu_count=1)
    with pytest.raises(ValidationError) as refused:
        request_vm(tenant, pools["h100-spot"], name="also", gpu_count=1)
    assert refused.value.message_dict == {
        "pool": [
            "over acme's quota in pool h100-spot: at most 1 pending request; acme has 1 "
            "waiting (waits)"
        ]
    }


def test_another_tenants_quota_binds_only_it(tenant, other_tenant, pools, operator):
    from gpucap.allocation import services as allocation

    allocation.quota_set(
        tenant=other_tenant, pool=pools["l40s-ondemand"], max_gpus=0, actor=operator
    )
    request_vm(tenant, pools["l40s-ondemand"], name="mine", gpu_count=1)
    with pytest.raises(ValidationError):
        request_vm(other_tenant, pools["l40s-ondemand"], name="theirs", gpu_count=1)


def test_a_job_past_the_quota_is_refused_whole(tenant, pools, quota):
    quota(8)
    before = world()
    with pytest.raises(ValidationError) as refused:
        job_request(
            tenant=tenant,
            pool=pools["h100-spot"],
            job="train",
            count=3,
            gpu_count=4,
            image=IMAGE,
            ssh_public_key=SSH_KEY,
        )
    assert (
        "over acme's quota in pool h100-spot: 8 GPUs" in refused.value.message_dict["gpu_count"][0]
    )
    assert world() == before
