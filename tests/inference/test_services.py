"""Deployments and API keys through the services: validation, replicas asked for as one group,
keys stored as a prefix and a salted hash."""

import json

import pytest
from django.core.exceptions import ValidationError

from gpucap.inference import cache, keys
from gpucap.inference import services as inference
from gpucap.inference.models import ApiKey, InferenceDeployment
from gpucap.rentals.models import VirtualMachine


def test_a_deployment_asks_for_its_minimum_replicas_as_one_group(deploy):
    deployment = deploy(min_replicas=2, max_replicas=4, gpus_per_replica=2)

    replicas = list(deployment.replicas.order_by("pk"))
    assert [vm.state for vm in replicas] == ["pending", "pending"]
    assert {vm.role for vm in replicas} == {VirtualMachine.Role.INFERENCE_REPLICA}
    assert {vm.gpu_count for vm in replicas} == {2}
    assert len({vm.demand_group for vm in replicas}) == 1 and replicas[0].demand_group


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"min_replicas": 3, "max_replicas": 2}, "min_replicas"),
        ({"max_replicas": 0}, "max_replicas"),
        ({"gpus_per_replica": 3}, "gpus_per_replica"),
        ({"target_in_flight": 8, "replica_concurrency": 4}, "replica_concurrency"),
        ({"queue_limit": -1}, "queue_limit"),
        ({"warp_speed": 9}, "warp_speed"),
    ],
)
def test_bad_settings_name_the_field_and_create_nothing(deploy, changes, field):
    with pytest.raises(ValidationError) as bad:
        deploy(**changes)
    assert field in bad.value.message_dict
    assert not InferenceDeployment.objects.exists() and not VirtualMachine.objects.exists()


def test_a_deployment_needs_an_inference_pool(tenant, fleet_east, inference_pools):
    with pytest.raises(ValidationError) as bad:
        inference.deployment_create(
            tenant=tenant,
            pool=fleet_east["pools"]["h100-spot"],
            name="chat",
            model_name="m",
            gpus_per_replica=1,
        )
    assert "inference pool" in bad.value.message_dict["pool"][0]


def test_an_api_key_is_shown_once_and_stored_as_prefix_and_salted_hash(deploy, tenant):
    deployment = deploy()
    api_key, secret = inference.api_key_create(tenant=tenant, name="prod", deployment=deployment)

    prefix, body = keys.key_parse(secret)
    assert prefix == api_key.prefix and body not in api_key.digest
    assert keys.key_matches(salt=api_key.salt, digest=api_key.digest, secret=body)
    # One character off (a body ending in "x" is changed to "y": the same body would match).
    typo = body[:-1] + ("y" if body.endswith("x") else "x")
    assert not keys.key_matches(salt=api_key.salt, digest=api_key.digest, secret=typo)
    assert secret not in json.dumps(list(ApiKey.objects.values()), default=str)


def test_revoking_a_key_reaches_the_router_document(
    deploy, tenant, django_capture_on_commit_callbacks
):
    deployment = deploy()
    with django_capture_on_commit_callbacks(execute=True):
        api_key, _ = inference.api_key_create(tenant=tenant, name="prod", deployment=deployment)
    document = json.loads(cache.inference_redis().get(cache.api_key_key(api_key.prefix)))
    assert document["revoked"] is False and document["deployment"] == deployment.slug

    with django_capture_on_commit_callbacks(execute=True):
        inference.api_key_revoke(api_key=api_key)

    document = json.loads(cache.inference_redis().get(cache.api_key_key(api_key.prefix)))
    assert document["revoked"] is True


@pytest.mark.parametrize("action", ["vm_stop", "vm_terminate", "vm_start"])
def test_a_tenant_cannot_stop_or_delete_a_replica_behind_its_deployments_back(deploy, action):
    from gpucap.errors import Conflict
    from gpucap.rentals import services as rentals

    replica = deploy().replicas.get()

    with pytest.raises(Conflict) as refused:
        getattr(rentals, action)(vm=replica)

    assert refused.value.code == "managed_by_deployment"
    assert VirtualMachine.objects.get(pk=replica.pk).state == "pending"


def test_a_long_name_is_refused_on_the_name_field(deploy):
    with pytest.raises(ValidationError) as bad:
        deploy(name="a" * 60)
    assert "router path" in bad.value.message_dict["name"][0]


def test_replica_names_never_collide_with_the_tenants_vms(deploy, tenant, fleet_east):
    from tests.rentals.vm_helpers import request_vm

    request_vm(tenant, fleet_east["pools"]["h100-spot"], name="chat-r1")
    deployment = deploy(min_replicas=1)
    assert deployment.replicas.get().name == "chat-r2"


def test_a_reclaimed_replica_is_withdrawn_not_kept_stopped(deploy, fleet_east):
    from gpucap.rentals import services as rentals

    replica = deploy(where="set").replicas.get()
    rentals.vm_place(vm=replica, node=fleet_east["nodes"]["h100-001"], gpu_indices=[0])
    rentals.vm_mark_running(vm=replica, ip_address="10.200.9.9")

    stopping = rentals.vm_stop_for_notice(vm=replica, message="arbiter notice deadline")
    done = rentals.vm_mark_stopped(vm=stopping)

    assert done.state == "terminated", "its deployment asks for a new replica instead"
