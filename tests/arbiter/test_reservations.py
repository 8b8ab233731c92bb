"""Tenant reservations in the pure arbiter (issue 19), checked by hand on sets small enough to
work out on paper. The properties over random sets are in test_reservation_rules.py."""

import dataclasses
import json
from pathlib import Path

import pytest

from gpucap.arbiter import SnapshotError, dump_plan, plan
from gpucap.arbiter.codec import plan_to_dict, snapshot_from_dict, snapshot_to_dict
from gpucap.arbiter.explain import render_plan
from gpucap.arbiter.model import Node, Pool, Reservation
from tests.arbiter.fleets import demand, snapshot, standard_pools, vm
from tests.arbiter.rules import rule_violations

ALL = tuple(range(8))
GOLDEN = Path(__file__).parent / "golden" / "plans_without_reservations.json"
GOLDEN_RESERVED = Path(__file__).parent / "golden" / "plans_reserved_without_tenant_vms.json"


def planned(**fleet):
    fleet = snapshot(**fleet)
    result = plan(fleet)
    assert rule_violations(fleet, result) == []
    return result


def placed(result) -> dict[str, tuple[str, tuple[int, ...], str | None, str | None]]:
    return {p.demand: (p.node, p.gpus, p.reservation, p.borrowed) for p in result.placements}


def reasons(result) -> dict[str, str]:
    return {u.demand: u.reason for u in result.unsatisfied}


def report(result, index: int = 0) -> dict:
    return plan_to_dict(result)["reservations"][index]


R8 = Reservation("r1", "acme", 8, 8)


def test_a_claim_takes_the_kept_free_capacity():
    result = planned(
        nodes=[Node("n001", 8)],
        demands=[
            demand("g1", "rent", 8, tenant="globex", minute=300),
            demand("a1", "spot", 8, tenant="acme", minute=310),
        ],
        reservations=[R8],
    )
    # acme's spot demand ranks and comes after globex's, yet claims the kept node first.
    assert placed(result) == {"a1": ("n001", ALL, "r1", None)}
    assert "kept free for tenant acme's reservation r1" not in reasons(result)["g1"]
    assert report(result) == {
        "id": "r1",
        "tenant": "acme",
        "gpus": 8,
        "block_gpus": 8,
        "short_gpus": 0,
        "held_before": 0,
        "held_after": 8,
        "kept_gpus": 0,
        "borrowed": [],
        "claim_reclaims": [],
        "claim_complete": True,
    }


def test_another_tenants_on_demand_demand_cannot_take_kept_capacity():
    result = planned(
        nodes=[Node("n001", 8)],
        demands=[demand("g1", "rent", 8, tenant="globex")],
        reservations=[R8],
    )
    assert result.placements == ()
    assert reasons(result)["g1"].endswith(
        "; 8 GPUs kept free for tenant acme's reservation r1 could serve it, but only acme's "
        "claims and other tenants' spot demands may use them"
    )
    assert report(result)["kept_gpus"] == 8


def test_a_spot_demand_of_another_tenant_borrows_kept_capacity():
    result = planned(
        nodes=[Node("n001", 8)],
        demands=[demand("g1", "spot", 8, tenant="globex")],
        reservations=[R8],
    )
    assert placed(result) == {"g1": ("n001", ALL, None, "r1")}
    assert plan_to_dict(result)["placements"][0]["borrowed"] == "r1"
    entry = report(result)
    assert (entry["kept_gpus"], entry["borrowed"]) == (0, ["g1"])
    # Claiming the reservation right after this plan would reclaim the borrower.
    assert (entry["claim_reclaims"], entry["claim_complete"]) == (["g1"], True)


def test_the_owners_claim_reclaims_its_borrower_first_whatever_its_rank():
    pools = [*standard_pools(), Pool("scavenger", "spot", 4, 0)]
    result = planned(
        nodes=[Node("n001", 8), Node("n002", 8)],
        pools=pools,
        vms=[
            # Same rank as the claim (rule 3 alone would protect it), and borrowing.
            vm("b1", "spot", "n001", ALL, tenant="globex", borrowed="r1"),
            # Ranked lowest: rule 7 alone would reclaim it.
            vm("l1", "scavenger", "n002", ALL, tenant="initech"),
        ],
        demands=[demand("a1", "spot", 8, tenant="acme")],
        reservations=[R8],
    )
    assert placed(result) == {"a1": ("n001", ALL, "r1", None)}
    (preemption,) = result.preemptions
    assert (preemption.vm, preemption.pool) == ("b1", "spot")
    assert preemption.reason == (
        "reclaimed for a1 (tenant acme's claim on its reservation r1): it borrowed capacity "
        "kept for that reservation"
    )
    assert report(result)["borrowed"] == []


def test_a_claim_ignores_the_borrowers_floor_and_protection():
    pools = [Pool("chat", "inference", 1), Pool("spot", "spot", 2, 8, protect_seconds=86400)]
    result = planned(
        nodes=[Node("n001", 8)],
        pools=pools,
        vms=[vm("b1", "spot", "n001", ALL, minute=590, tenant="globex", borrowed="r1")],
        demands=[demand("a1", "chat", 8, tenant="acme")],
        reservations=[R8],
    )
    assert [p.vm for p in result.preemptions] == ["b1"]


def test_a_demand_beyond_the_unused_part_is_ordinary():
    result = planned(
        nodes=[Node("n001", 8), Node("n002", 8), Node("n003", 8)],
        vms=[vm("a0", "rent", "n003", (0, 1, 2, 3), tenant="acme")],
        demands=[
            demand("a1", "rent", 4, tenant="acme", minute=300),
            demand("a2", "rent", 8, tenant="acme", minute=301),
            demand("g1", "rent", 8, tenant="globex", minute=302),
        ],
        reservations=[Reservation("r1", "acme", 8, 4)],
    )
    # acme holds 4 of 8: a1 (4) is its claim, a2 is beyond it, an ordinary demand.
    assert placed(result)["a1"][2] == "r1"
    assert placed(result)["a2"][2] is None
    assert {"a1", "a2", "g1"} == set(placed(result))
    assert report(result)["held_after"] == 16


def test_blocks_of_eight_are_kept_whole_on_nvswitch():
    result = planned(
        nodes=[Node("n001", 8), Node("n002", 8), Node("n003", 8)],
        vms=[vm("a0", "rent", "n001", (0, 1, 2, 3), tenant="acme")],
        demands=[
            demand("g1", "rent", 4, tenant="globex", minute=300),
            demand("g2", "rent", 8, tenant="globex", minute=301),
        ],
        reservations=[Reservation("r1", "acme", 16, 8)],
    )
    # acme uses 4 of 16: 12 unused, kept as two whole 8-GPU blocks (n002, n003).
    assert placed(result) == {"g1": ("n001", (4, 5, 6, 7), None, None)}
    assert "16 GPUs kept free for tenant acme's reservation r1" in reasons(result)["g2"]
    (entry,) = result.reservations
    assert entry.kept_gpus == 16
    assert sorted(entry.kept_blocks) == [("n002", ALL), ("n003", ALL)]


def test_a_reservation_held_in_full_changes_nothing():
    fleet = snapshot(
        nodes=[Node("n001", 8), Node("n002", 8)],
        vms=[
            vm("a0", "rent", "n001", ALL, tenant="acme"),
            vm("s1", "spot", "n002", (0, 1, 2, 3), tenant="globex"),
        ],
        demands=[demand("g1", "rent", 4, tenant="globex"), demand("g2", "rent", 8)],
        reservations=[R8],
    )
    result = plan(fleet)
    assert dataclasses.replace(result, reservations=()) == plan(
        dataclasses.replace(fleet, reservations=())
    )
    assert report(result)["kept_gpus"] == 0 and report(result)["claim_complete"]


def test_an_unknown_borrowed_id_means_not_borrowing():
    fleet = snapshot(
        nodes=[Node("n001", 8), Node("n002", 8)],
        vms=[
            vm("s1", "spot", "n001", ALL, tenant="globex", borrowed="ended"),
            vm("s2", "spot", "n002", ALL, tenant="globex", borrowed="r1", minute=100),
        ],
        demands=[demand("a1", "rent", 8, tenant="acme")],
        reservations=[R8],
    )
    assert snapshot_from_dict(json.loads(json.dumps(snapshot_to_dict(fleet)))) == fleet
    result = plan(fleet)
    assert rule_violations(fleet, result) == []
    # s1 started earlier, so rule 7 would reclaim s2; the claim takes its borrower s2 first
    # either way, and s1's flag names no reservation in force.
    assert [p.vm for p in result.preemptions] == ["s2"]
    assert report(result)["borrowed"] == []
    unflagged = dataclasses.replace(
        fleet, vms=(dataclasses.replace(fleet.vms[0], borrowed=None), fleet.vms[1])
    )
    assert dump_plan(plan(unflagged)) == dump_plan(result)


def test_claim_reclaims_say_what_claiming_the_unused_part_would_take():
    result = planned(
        nodes=[Node("n001", 8), Node("n002", 8)],
        vms=[
            vm("b1", "spot", "n002", (0, 1, 2, 3), tenant="globex", borrowed="r1"),
            vm("s1", "spot", "n002", (4, 5), tenant="initech"),
            vm("o1", "rent", "n002", (6, 7), tenant="globex"),
        ],
        demands=[demand("a1", "rent", 4, tenant="acme")],
        reservations=[Reservation("r1", "acme", 16, 4)],
    )
    entry = report(result)
    # a1 claims 4 of n001; 12 unused: n001's other half is kept, b1 would be reclaimed for
    # the second block, and no third block can be had (o1 is on-demand).
    assert placed(result) == {"a1": ("n001", (0, 1, 2, 3), "r1", None)}
    assert (entry["held_after"], entry["kept_gpus"]) == (4, 4)
    assert (entry["claim_reclaims"], entry["claim_complete"]) == (["b1"], False)
    assert entry["borrowed"] == ["b1"]


def test_a_spot_vm_a_claim_would_reclaim_becomes_a_borrower():
    result = planned(
        nodes=[Node("n001", 8)],
        vms=[vm("s1", "spot", "n001", ALL, tenant="globex")],
        reservations=[R8],
    )
    entry = report(result)
    assert (entry["kept_gpus"], entry["claim_reclaims"], entry["borrowed"]) == (0, ["s1"], ["s1"])


def test_a_claim_does_not_take_the_blocks_kept_for_another_reservation():
    result = planned(
        nodes=[Node("n001", 8), Node("n002", 8)],
        vms=[vm("b1", "spot", "n002", ALL, tenant="initech", borrowed="r1")],
        demands=[demand("a1", "rent", 8, tenant="acme")],
        reservations=[R8, Reservation("r2", "globex", 8, 8)],
    )
    # n001 is free but kept for globex: acme's claim reclaims its borrower on n002 instead.
    assert placed(result) == {"a1": ("n002", ALL, "r1", None)}
    assert [r.kept_gpus for r in result.reservations] == [0, 8]


def test_the_preview_lists_reservations():
    fleet = snapshot(
        nodes=[Node("n001", 8)],
        demands=[demand("g1", "spot", 4, tenant="globex")],
        reservations=[R8],
    )
    text = render_plan(fleet, plan(fleet))
    assert "  g1      n001  0,1,2,3  -         borrows from r1\n" in text
    assert "Reservations\n  id  tenant  gpus  block  held   kept  borrowed  claim reclaims" in text
    assert "  r1  acme    8     8      0 → 0  0     g1        g1 (complete)" in text


def test_plans_without_reservations_are_byte_identical_to_before():
    """Plans of snapshots without reservations, made before reservations existed."""
    for case in json.loads(GOLDEN.read_text()):
        fleet = snapshot_from_dict(case["snapshot"])
        assert dump_plan(plan(fleet)) == case["plan"], case["name"]
        assert "reservation" not in case["plan"] and "borrowed" not in case["plan"]


def test_plans_whose_reservations_tenants_run_no_vm_are_byte_identical_to_before():
    """Nothing is held inside a reservation whose tenant runs no VM (rule 4): plans made before
    VMs were held (at 8a924c3: bench sets with tenancy and reservations, their tenants' VMs
    removed, and small contested sets with reservations and borrowers) are made again."""
    for case in json.loads(GOLDEN_RESERVED.read_text()):
        fleet = snapshot_from_dict(case["snapshot"])
        tenants = {r.tenant for r in fleet.reservations}
        assert fleet.reservations and not any(vm.tenant in tenants for vm in fleet.vms)
        assert dump_plan(plan(fleet)) == case["plan"], case["name"]


# -- the snapshot file -------------------------------------------------------------------------


def _problems(reservations: list[dict], nodes: int = 2) -> list[str]:
    data = snapshot_to_dict(snapshot(nodes=[Node(f"n{i:03d}", 8) for i in range(1, nodes + 1)]))
    data["reservations"] = reservations
    with pytest.raises(SnapshotError) as error:
        snapshot_from_dict(data)
    return error.value.problems


@pytest.mark.parametrize(
    ("reservations", "expected"),
    [
        (
            [{"id": "r1", "tenant": "acme", "gpus": 12, "block_gpus": 8}],
            ["reservations[0] (r1): gpus must be a multiple of block_gpus 8, got 12"],
        ),
        (
            [{"id": "r1", "tenant": "acme", "gpus": 6, "block_gpus": 3}],
            [
                "reservations[0] (r1): block_gpus must be a partition size of this nvswitch "
                "set (1, 2, 4, 8), got 3"
            ],
        ),
        (
            [{"id": "r1", "tenant": "acme", "gpus": 0}],
            ["reservations[0] (r1): gpus must be 1 or more, got 0"],
        ),
        (
            [
                {"id": "r1", "tenant": "acme", "gpus": 1},
                {"id": "r1", "tenant": "globex", "gpus": 1},
            ],
            ["reservations[1] (r1): id r1 is used by another reservation"],
        ),
        (
            [{"id": "r1", "tenant": "acme", "gpus": 1}, {"id": "r2", "tenant": "acme", "gpus": 1}],
            [
                "reservations[1] (r2): tenant acme already has reservation r1; a tenant has at "
                "most one reservation in a set"
            ],
        ),
        (
            [{"id": "r1", "tenant": "acme", "gpus": "8"}],
            ['reservations[0] (r1): gpus must be an integer, got "8"'],
        ),
    ],
)
def test_bad_reservations_are_named(reservations, expected):
    assert _problems(reservations) == expected


def test_a_pcie_reservation_is_in_single_cards():
    data = snapshot_to_dict(snapshot(fabric="pcie", nodes=[Node("n001", 8)]))
    data["reservations"] = [{"id": "r1", "tenant": "acme", "gpus": 4, "block_gpus": 2}]
    with pytest.raises(SnapshotError) as error:
        snapshot_from_dict(data)
    assert error.value.problems == [
        "reservations[0] (r1): block_gpus must be a partition size of this pcie set (1), got 2"
    ]
    data["reservations"] = [{"id": "r1", "tenant": "acme", "gpus": 4}]
    assert snapshot_from_dict(data).reservations == (Reservation("r1", "acme", 4, 1),)
