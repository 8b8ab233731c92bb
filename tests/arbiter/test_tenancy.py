"""Tenant allocation in the pure arbiter (issue 19): quotas and dedicated nodes, checked by hand
on sets small enough to work out on paper. The properties over random sets are in
test_rules.py (``tenancy=True``)."""

import dataclasses
import json

import pytest

from gpucap.arbiter import SnapshotError, plan
from gpucap.arbiter.codec import snapshot_from_dict, snapshot_to_dict
from gpucap.arbiter.explain import render_plan
from gpucap.arbiter.model import Node, Quota
from tests.arbiter.fleets import demand, snapshot, vm
from tests.arbiter.rules import rule_violations

ALL = tuple(range(8))


def planned(**fleet):
    fleet = snapshot(**fleet)
    result = plan(fleet)
    assert rule_violations(fleet, result) == []
    return result


def placed(result) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {p.demand: (p.node, p.gpus) for p in result.placements}


def reasons(result) -> dict[str, str]:
    return {u.demand: u.reason for u in result.unsatisfied}


# -- quotas -----------------------------------------------------------------------------------


def test_a_quota_exactly_met_places_the_group():
    result = planned(
        nodes=[Node("n001", 8)],
        vms=[vm("a1", "rent", "n001", (0, 1, 2, 3), tenant="acme")],
        demands=[demand("d1", "rent", 4, tenant="acme")],
        quotas=[Quota("acme", "rent", 8)],
    )
    assert placed(result) == {"d1": ("n001", (4, 5, 6, 7))}
    assert result.complete


def test_a_quota_one_gpu_short_refuses_a_two_vm_group_whole():
    result = planned(
        nodes=[Node("n001", 8), Node("n002", 8)],
        vms=[vm("a1", "rent", "n001", (0, 1, 2, 3), tenant="acme")],
        demands=[
            demand("j-0", "rent", 2, group="acme/j", tenant="acme"),
            demand("j-1", "rent", 2, group="acme/j", tenant="acme"),
        ],
        quotas=[Quota("acme", "rent", 7)],
    )
    # One VM of the group would fit the quota (4 + 2 <= 7); the group is refused whole.
    assert result.placements == ()
    words = "tenant acme's quota in pool rent is 7 GPUs; it holds 4 (a1) and this group asks for 4"
    assert reasons(result) == {"j-0": words, "j-1": words}


def test_a_set_quota_counts_notified_vms_and_the_plans_own_placements():
    result = planned(
        nodes=[Node("n001", 8), Node("n002", 8)],
        vms=[vm("a1", "spot", "n001", (0, 1, 2, 3), tenant="acme", state="notified")],
        demands=[
            demand("d1", "rent", 2, tenant="acme", minute=300),
            demand("d2", "rent", 4, tenant="acme", minute=301),
            demand("d3", "rent", 4, tenant="globex", minute=302),
        ],
        quotas=[Quota("acme", None, 8)],
    )
    assert set(placed(result)) == {"d1", "d3"}
    assert reasons(result) == {
        "d2": "tenant acme's quota in set test-set is 8 GPUs; it holds 6 (a1, d1) and this "
        "group asks for 4"
    }


def test_a_quota_never_preempts_its_tenants_own_vms():
    # acme's rent demand outranks its own spot VM, but reclaiming it would still leave acme
    # holding the notified VM's GPUs: the quota refuses, and nothing is preempted.
    result = planned(
        nodes=[Node("n001", 8)],
        vms=[vm("a1", "spot", "n001", ALL, tenant="acme")],
        demands=[demand("d1", "rent", 8, tenant="acme")],
        quotas=[Quota("acme", None, 8)],
    )
    assert result.preemptions == ()
    assert reasons(result)["d1"].startswith("tenant acme's quota in set test-set is 8 GPUs")


def test_a_quota_lowered_below_use_stops_nothing_and_blocks_only_that_scope():
    result = planned(
        nodes=[Node("n001", 8), Node("n002", 8)],
        vms=[vm("a1", "spot", "n001", ALL, tenant="acme")],
        demands=[
            demand("d1", "spot", 1, tenant="acme"),
            demand("d2", "rent", 1, tenant="acme"),
            demand("d3", "rent", 1, tenant="globex"),
        ],
        quotas=[Quota("acme", "spot", 4)],
    )
    assert result.preemptions == ()
    assert set(placed(result)) == {"d2", "d3"}
    assert reasons(result) == {
        "d1": "tenant acme's quota in pool spot is 4 GPUs; it holds 8 (a1) and this group asks "
        "for 1"
    }


def test_a_zero_quota_names_no_holders():
    result = planned(
        demands=[demand("d1", "rent", 2, tenant="acme")],
        quotas=[Quota("acme", "rent", 0)],
    )
    assert reasons(result) == {
        "d1": "tenant acme's quota in pool rent is 0 GPUs; it holds 0 and this group asks for 2"
    }


# -- dedicated nodes ----------------------------------------------------------------------------


def test_a_dedicated_node_with_free_gpus_is_not_used_by_another_tenant():
    result = planned(
        nodes=[Node("n001", 8, tenant="acme"), Node("n002", 8)],
        vms=[vm("g1", "rent", "n002", ALL, tenant="globex")],
        demands=[demand("d1", "rent", 8, tenant="globex"), demand("d2", "rent", 4)],
    )
    assert result.placements == ()
    assert reasons(result)["d1"] == (
        "no node has a free or reclaimable 8-GPU partition: only on-demand VMs hold the "
        "candidate partitions, and on-demand VMs are never preempted; 1 node has a free 8-GPU "
        "partition but is dedicated to other tenants (n001)"
    )
    assert reasons(result)["d2"].endswith(
        "1 node has a free 4-GPU partition but is dedicated to other tenants (n001)"
    )


def test_a_tenant_takes_its_dedicated_node_before_shared_capacity():
    result = planned(
        nodes=[Node("n001", 8), Node("n002", 8, tenant="acme")],
        demands=[demand("d1", "rent", 8, tenant="acme"), demand("d2", "rent", 8, tenant="acme")],
    )
    assert placed(result) == {"d1": ("n002", ALL), "d2": ("n001", ALL)}


def test_a_disk_on_another_tenants_dedicated_node_does_not_draw_the_vm_there():
    resuming = [
        dataclasses.replace(demand("d1", "spot", 4, tenant="globex"), disk_node="n001"),
        dataclasses.replace(demand("d2", "spot", 4, tenant="acme"), disk_node="n001"),
    ]
    result = planned(nodes=[Node("n001", 8, tenant="acme"), Node("n002", 8)], demands=resuming)
    assert placed(result)["d1"][0] == "n002"
    assert placed(result)["d2"][0] == "n001"


def test_only_the_dedicated_tenant_may_reclaim_its_vms_there():
    fleet = {
        "nodes": [Node("n001", 8, tenant="acme")],
        "vms": [vm("a1", "spot", "n001", ALL, tenant="acme")],
    }
    other = planned(**fleet, demands=[demand("d1", "rent", 8, tenant="globex")])
    assert other.preemptions == () and not other.complete
    own = planned(**fleet, demands=[demand("d1", "rent", 8, tenant="acme")])
    assert placed(own) == {"d1": ("n001", ALL)}
    assert [p.vm for p in own.preemptions] == ["a1"]


def test_another_tenants_vm_on_a_dedicated_node_is_left_alone():
    result = planned(
        nodes=[Node("n001", 8, tenant="acme")],
        vms=[vm("g1", "spot", "n001", (0, 1, 2, 3), tenant="globex")],
        demands=[demand("d1", "rent", 8, tenant="acme"), demand("d2", "rent", 4, tenant="acme")],
    )
    assert result.preemptions == ()
    assert placed(result) == {"d2": ("n001", (4, 5, 6, 7))}
    assert set(reasons(result)) == {"d1"}


def test_a_demand_blocked_on_its_own_node_by_another_tenants_vm_says_so():
    result = planned(
        nodes=[Node("n001", 8, tenant="acme")],
        vms=[vm("g1", "spot", "n001", ALL, tenant="globex")],
        demands=[demand("d1", "rent", 8, tenant="acme")],
    )
    assert reasons(result) == {
        "d1": "no node has a free or reclaimable 8-GPU partition: every candidate is held by a "
        "VM of another tenant on a node dedicated to this tenant, which the arbiter leaves alone"
    }


def test_a_demand_that_may_use_its_own_node_is_explained_over_both_scopes():
    # The shared node holds an on-demand VM (never reclaimed); acme's node holds its own chat
    # VM (rank 1): what stops the demand is the rank of the VM on its own node.
    result = planned(
        nodes=[Node("n001", 8), Node("n002", 8, tenant="acme")],
        vms=[
            vm("r1", "rent", "n001", ALL, tenant="globex"),
            vm("c2", "chat", "n002", ALL, tenant="acme"),
        ],
        demands=[demand("d1", "rent", 8, tenant="acme")],
    )
    assert reasons(result)["d1"].startswith(
        "no free 8-GPU partition, and every reclaimable one holds a VM of pool chat (rank 1)"
    )


def test_the_preview_shows_the_refusals_in_words():
    fleet = snapshot(
        nodes=[Node("n001", 8, tenant="acme")],
        demands=[demand("d1", "rent", 4, tenant="globex"), demand("d2", "rent", 4, tenant="acme")],
        quotas=[Quota("acme", "rent", 2)],
    )
    text = render_plan(fleet, plan(fleet))
    assert "Unsatisfied (2)" in text
    assert "tenant acme's quota in pool rent is 2 GPUs; it holds 0 and this group asks for 4" in (
        text
    )
    assert "dedicated to other tenants (n001)" in text
    assert "Quotas\n  tenant  pool  max  before  after\n  acme    rent  2    0       0\n" in text


# -- the snapshot file -------------------------------------------------------------------------


def test_the_new_fields_are_written_only_when_set():
    plain = snapshot_to_dict(snapshot(demands=[demand("d1", "rent", 1)]))
    assert "quotas" not in plain
    assert "tenant" not in plain["nodes"][0] and "tenant" not in plain["demands"][0]
    fleet = snapshot(
        nodes=[Node("n001", 8, tenant="acme")],
        demands=[demand("d1", "rent", 1, tenant="acme")],
        quotas=[Quota("acme", None, 8)],
    )
    data = snapshot_to_dict(fleet)
    assert data["nodes"][0]["tenant"] == "acme"
    assert data["demands"][0]["tenant"] == "acme"
    assert data["quotas"] == [{"tenant": "acme", "pool": None, "max_gpus": 8}]
    assert snapshot_from_dict(json.loads(json.dumps(data))) == fleet


def _with(mutate) -> list[str]:
    data = snapshot_to_dict(
        snapshot(
            demands=[
                demand("d1", "rent", 1, group="g", tenant="acme"),
                demand("d2", "rent", 1, group="g", tenant="acme"),
            ]
        )
    )
    mutate(data)
    with pytest.raises(SnapshotError) as error:
        snapshot_from_dict(data)
    return error.value.problems


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda data: data.update(quotas=[{"tenant": "acme", "pool": "rent", "max_gpus": -1}]),
            ["quotas[0] (acme): max_gpus must be 0 or more, got -1"],
        ),
        (
            lambda data: data.update(quotas=[{"tenant": "acme", "pool": "batch", "max_gpus": 4}]),
            ["quotas[0] (acme): pool batch is not a pool of the snapshot"],
        ),
        (
            lambda data: data.update(quotas=[{"tenant": "acme", "max_gpus": "4"}]),
            ['quotas[0] (acme): max_gpus must be an integer, got "4"'],
        ),
        (
            lambda data: data.update(
                quotas=[{"tenant": "acme", "max_gpus": 4}, {"tenant": "acme", "max_gpus": 8}]
            ),
            ["quotas[1] (acme): tenant acme's quota for the whole set is given twice"],
        ),
        (
            lambda data: data.update(quotas=[{"pool": "rent", "max_gpus": 4}]),
            ['quotas[0]: missing field "tenant"'],
        ),
        (
            lambda data: data.update(quotas={"tenant": "acme"}),
            ['quotas: must be a list, got {"tenant": "acme"}'],
        ),
        (
            lambda data: data["nodes"][0].update(tenant=7),
            ["nodes[0] (n001): tenant must be a string, got 7"],
        ),
        (
            lambda data: data["nodes"][0].update(tenant=""),
            ["nodes[0] (n001): tenant must not be empty (null: a shared node)"],
        ),
        (
            lambda data: data["demands"][1].update(tenant="globex"),
            [
                "demands[1] (d2): tenant globex differs from tenant acme of demand d1; the "
                "demands of group g must share one tenant"
            ],
        ),
    ],
)
def test_bad_tenant_fields_are_named(mutate, expected):
    assert _with(mutate) == expected
