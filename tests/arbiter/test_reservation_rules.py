"""Property tests for reservations (issue 19): over random sets of both fabrics with tenants,
dedicated nodes, quotas, reservations and borrowers, every plan keeps every rule the referee
knows (tests/arbiter/rules.py and reserved.py): kept capacity only for its tenant and
borrowers, borrowers reclaimed first by claims, dedicated nodes and quotas as before."""

import dataclasses

from hypothesis import HealthCheck, given, settings

from gpucap.arbiter import dump_plan, plan, snapshot_problems
from tests.arbiter.fleets import snapshots
from tests.arbiter.reserved import held_inside, honoured
from tests.arbiter.rules import rule_violations

HELD_WORDS = "waits: the VMs it could reclaim are held inside"
PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(snapshots(fabric="nvswitch", max_jobs=2, tenancy=True, reservations=True))
def test_nvswitch_plans_keep_reservations(snapshot):
    assert snapshot_problems(snapshot) == []
    assert rule_violations(snapshot, plan(snapshot)) == []


@PROPERTY
@given(snapshots(fabric="pcie", max_jobs=2, tenancy=True, reservations=True))
def test_pcie_plans_keep_reservations(snapshot):
    assert snapshot_problems(snapshot) == []
    assert rule_violations(snapshot, plan(snapshot)) == []


@PROPERTY
@given(
    snapshots(
        max_nodes=4,
        max_demands=10,
        max_groups=3,
        crowded=True,
        max_jobs=2,
        tenancy=True,
        reservations=True,
    )
)
def test_crowded_sets_keep_reservations(snapshot):
    assert rule_violations(snapshot, plan(snapshot)) == []


@settings(max_examples=60, deadline=None)
@given(snapshots(max_jobs=2, tenancy=True, reservations=True))
def test_planning_with_reservations_twice_gives_the_same_bytes(snapshot):
    assert dump_plan(plan(snapshot)) == dump_plan(plan(snapshot))


@settings(max_examples=80, deadline=None)
@given(snapshots(max_jobs=2, tenancy=True, reservations=True))
def test_reservations_in_full_use_without_borrowers_change_nothing_but_spare_what_they_hold(
    snapshot,
):
    """A reservation whose tenant holds all of it keeps nothing and claims nothing: the plan is
    the plan without it, in which the VMs it holds (rule 4, as the referee picks them) are no
    victims; a wait only they cause says so instead of the planner's words."""
    held = {}
    for vm in snapshot.vms:
        if vm.state == "running" and vm.tenant is not None:
            held[vm.tenant] = held.get(vm.tenant, 0) + len(vm.gpus)
    used = tuple(
        dataclasses.replace(
            r, gpus=min(r.gpus, held.get(r.tenant, 0) // r.block_gpus * r.block_gpus)
        )
        for r in snapshot.reservations
    )
    used = tuple(r for r in used if r.gpus > 0)
    fleet = dataclasses.replace(
        snapshot,
        reservations=used,
        vms=tuple(dataclasses.replace(vm, borrowed=None) for vm in snapshot.vms),
    )
    inside = held_inside(list(used), honoured(fleet), list(fleet.vms), set())
    result = plan(fleet)
    plain = plan(dataclasses.replace(fleet, reservations=()), held=frozenset(inside))
    assert dataclasses.replace(result, reservations=(), unsatisfied=()) == dataclasses.replace(
        plain, unsatisfied=()
    )
    assert [(u.demand, u.group, u.waits_until) for u in result.unsatisfied] == [
        (u.demand, u.group, u.waits_until) for u in plain.unsatisfied
    ]
    for ours, theirs in zip(result.unsatisfied, plain.unsatisfied, strict=True):
        assert ours.reason == theirs.reason or ours.reason.startswith(HELD_WORDS)
    # Nothing it holds is reclaimed: it stays in full use, and a claim after the plan is complete.
    assert all(
        r.kept_gpus == 0 and r.claim_complete and r.held_after >= r.gpus - r.short_gpus
        for r in result.reservations
    )


def test_a_bench_sized_set_with_reservations_obeys_every_rule():
    import random

    from bench.arbiter_scale import generate, with_reservations, with_tenancy
    from gpucap.arbiter.codec import snapshot_from_dict

    data = generate(400, random.Random(3))
    with_tenancy(data, random.Random(4))
    with_reservations(data, random.Random(5))
    snapshot = snapshot_from_dict(data)
    result = plan(snapshot)
    assert any(p.reservation for p in result.placements)
    assert any(r.claim_reclaims for r in result.reservations)
    assert rule_violations(snapshot, result) == []


@settings(max_examples=80, deadline=None)
@given(snapshots(max_jobs=2, tenancy=True, reservations=True))
def test_reservations_past_the_ready_gpus_are_planned_as_what_is_honoured(snapshot):
    """A reservation the set's ready shared GPUs cannot cover (a node went down) is never a
    problem of the snapshot: the plan is the plan of the reservations cut to what is honoured
    (in the order given, in whole blocks), and the report says how far each is short."""
    assert snapshot_problems(snapshot) == []
    given_gpus = honoured(snapshot)
    cut = dataclasses.replace(
        snapshot,
        reservations=tuple(
            dataclasses.replace(r, gpus=given_gpus[r.id]) for r in snapshot.reservations
        ),
    )
    result, planned_cut = plan(snapshot), plan(cut)
    assert dataclasses.replace(result, reservations=()) == dataclasses.replace(
        planned_cut, reservations=()
    )
    assert [(r.gpus, r.short_gpus) for r in result.reservations] == [
        (r.gpus, r.gpus - given_gpus[r.id]) for r in snapshot.reservations
    ]
