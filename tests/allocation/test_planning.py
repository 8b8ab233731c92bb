"""The arbiter never places past a quota in a real planning tick: an inference deployment's
scale-up is a demand like any other, and the snapshot carries the quotas that bind the set
(a GPU-model quota as the headroom its other sets leave)."""

from gpucap.allocation import services as allocation
from gpucap.allocation.selectors import set_quotas
from gpucap.arbiter import model as am
from gpucap.fleet import services as fleet
from gpucap.inference import services as inference
from gpucap.plans.models import PlanAction
from gpucap.plans.services import capacity_set_tick
from tests.rentals.vm_helpers import running_vm


def _deploy(tenant, fleet_east, member, replicas: int):
    pool = fleet_east["pools"]["h100-inference"]
    fleet.pool_set_tenants(pool=pool, tenants=[tenant])
    return inference.deployment_create(
        tenant=tenant,
        pool=pool,
        name="chat",
        model_name="gpucap/sim-8b",
        gpus_per_replica=4,
        min_replicas=replicas,
        max_replicas=replicas,
        actor=member,
    )


def _actions(plan) -> list[tuple[str, str, str]]:
    return list(plan.actions.order_by("kind", "position").values_list("kind", "vm__name", "reason"))


def test_a_scale_up_past_a_quota_is_not_placed_and_says_why(
    tenant, fleet_east, member, operator, h100
):
    pool = fleet_east["pools"]["h100-inference"]
    allocation.quota_set(tenant=tenant, pool=pool, max_gpus=4, actor=operator)
    deployment = _deploy(tenant, fleet_east, member, replicas=2)  # one group of 2 x 4 GPUs
    assert deployment.replicas.count() == 2  # asked for: the quota does not refuse replicas

    plan = capacity_set_tick(capacity_set_id=h100.pk).plan
    actions = _actions(plan)
    assert {kind for kind, _vm, _reason in actions} == {PlanAction.Kind.UNSATISFIED}
    assert "tenant acme's quota in pool h100-inference is 4 GPUs" in actions[0][2]

    allocation.quota_set(tenant=tenant, pool=pool, max_gpus=8, actor=operator)
    plan = capacity_set_tick(capacity_set_id=h100.pk).plan
    assert [kind for kind, _vm, _reason in _actions(plan)] == [PlanAction.Kind.PLACEMENT] * 2


def test_a_model_quota_enters_each_set_as_the_headroom_its_other_sets_leave(
    tenant, fleet_east, operator, h100
):
    west = fleet.capacity_set_create(
        cluster=fleet_east["cluster"],
        name="h100-west",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
    )
    node = fleet.node_create(
        cluster=fleet_east["cluster"],
        hostname="h100-101",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
    )
    node = fleet.node_join_set(node=node, capacity_set=west)
    west_spot = fleet.pool_create(
        name="h100-west-spot", kind="spot", cluster=fleet_east["cluster"], capacity_set=west, rank=1
    )
    fleet.pool_set_tenants(pool=west_spot, tenants=[tenant])
    running_vm(tenant, west_spot, node, [0, 1, 2, 3], name="west-1", ip="10.62.0.1")
    east_spot = fleet_east["pools"]["h100-spot"]
    running_vm(
        tenant, east_spot, fleet_east["nodes"]["h100-001"], [0, 1], name="east-1", ip="10.62.0.2"
    )
    allocation.quota_set(tenant=tenant, gpu_model="H100-SXM5-80GB", max_gpus=16, actor=operator)

    east = set_quotas(capacity_set=h100, pools=list(h100.pools.all()))
    west_quotas = set_quotas(capacity_set=west, pools=[west_spot])
    # 16 minus what acme holds in the other set: east sees 12 left, west sees 14.
    assert east == (am.Quota(tenant="acme", pool=None, max_gpus=12),)
    assert west_quotas == (am.Quota(tenant="acme", pool=None, max_gpus=14),)


def test_a_model_quota_used_up_elsewhere_leaves_no_room_here(
    tenant, fleet_east, operator, h100, pools
):
    l40s = fleet_east["sets"]["l40s-east"]
    allocation.quota_set(tenant=tenant, gpu_model="L40S", max_gpus=1, actor=operator)
    running_vm(
        tenant,
        pools["l40s-ondemand"],
        fleet_east["nodes"]["l40s-001"],
        [0],
        name="l40s-1",
        ip="10.62.0.3",
    )
    # Standalone pools of the model count as "elsewhere" too; here none: the set's own use is
    # the arbiter's to count, so the set's headroom stays the whole quota.
    assert set_quotas(capacity_set=l40s, pools=list(l40s.pools.all())) == (
        am.Quota(tenant="acme", pool=None, max_gpus=1),
    )


def test_outside_a_set_a_scale_up_past_a_quota_is_not_placed_either(
    tenant, fleet_east, member, operator
):
    from gpucap.plans.standalone import standalone_place
    from tests.inference.conftest import inference_pools_build

    pool = inference_pools_build(fleet_east, tenant)["standalone"]
    allocation.quota_set(tenant=tenant, pool=pool, max_gpus=1, actor=operator)
    deployment = inference.deployment_create(
        tenant=tenant,
        pool=pool,
        name="chat",
        model_name="gpucap/sim-8b",
        gpus_per_replica=1,
        min_replicas=2,
        max_replicas=2,
        actor=member,
    )
    result = standalone_place(cluster_id=fleet_east["cluster"].pk)
    assert result.placed == []
    assert "quota" in result.unsatisfied[0].reason
    assert set(deployment.replicas.values_list("state", flat=True)) == {"pending"}

    allocation.quota_set(tenant=tenant, pool=pool, max_gpus=2, actor=operator)
    assert len(standalone_place(cluster_id=fleet_east["cluster"].pk).placed) == 2
