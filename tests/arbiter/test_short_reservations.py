"""Reservations asking more than the set's ready shared GPUs (issue 19): a node going down or
cordoned must never leave the set unplanned. The plan is made, the reservations are honoured
as far as the ready GPUs go in the order given, and each report says how far it is short."""

from gpucap.arbiter import plan, snapshot_problems
from gpucap.arbiter.codec import plan_to_dict, snapshot_from_dict, snapshot_to_dict
from gpucap.arbiter.explain import render_plan
from gpucap.arbiter.model import Node, Reservation
from tests.arbiter.fleets import demand, snapshot, vm
from tests.arbiter.rules import rule_violations

ALL = tuple(range(8))


def planned(**fleet):
    fleet = snapshot(**fleet)
    assert snapshot_problems(fleet) == []
    result = plan(fleet)
    assert rule_violations(fleet, result) == []
    return fleet, result


def shortfalls(result) -> dict[str, tuple[int, int]]:
    return {r["id"]: (r["gpus"], r["short_gpus"]) for r in plan_to_dict(result)["reservations"]}


def test_a_node_going_down_under_a_full_reservation_still_plans_and_says_short():
    fleet, result = planned(
        nodes=[Node("n001", 8), Node("n002", 8, "down")],
        vms=[
            vm("a1", "rent", "n001", ALL, tenant="acme"),
            vm("a2", "rent", "n002", ALL, tenant="acme"),
        ],
        demands=[demand("g1", "rent", 4, tenant="globex")],
        reservations=[Reservation("r1", "acme", 16, 8)],
    )
    assert shortfalls(result) == {"r1": (16, 8)}
    (report,) = plan_to_dict(result)["reservations"]
    assert (report["held_before"], report["kept_gpus"], report["claim_complete"]) == (16, 0, True)
    assert [u.demand for u in result.unsatisfied] == ["g1"]  # the set is full, not refused
    assert (
        "r1: 8 GPUs short: the set has 8 ready GPUs not dedicated to a tenant, its reservations "
        "ask for 16 (honoured in the order given, in whole blocks)"
    ) in render_plan(fleet, result)


def test_reservations_are_honoured_in_the_order_given():
    """r1 comes first and is honoured whole; r2 gets nothing: globex's demand is no claim, and
    the node kept for acme stays kept."""
    reservations = [Reservation("r1", "acme", 8, 8), Reservation("r2", "globex", 8, 8)]
    fleet, result = planned(
        nodes=[Node("n001", 8), Node("n002", 8, "cordoned")],
        demands=[demand("g1", "rent", 8, tenant="globex")],
        reservations=reservations,
    )
    assert shortfalls(result) == {"r1": (8, 0), "r2": (8, 8)}
    assert result.placements == ()
    assert "kept free for tenant acme's reservation r1" in result.unsatisfied[0].reason
    text = render_plan(fleet, result)
    assert "r2: 8 GPUs short: the set has 8 ready GPUs not dedicated to a tenant" in text
    assert "r1: 8 GPUs short" not in text

    # The other order honours globex instead, and its demand claims the node.
    _, swapped = planned(
        nodes=[Node("n001", 8), Node("n002", 8, "cordoned")],
        demands=[demand("g1", "rent", 8, tenant="globex")],
        reservations=reservations[::-1],
    )
    assert shortfalls(swapped) == {"r2": (8, 0), "r1": (8, 8)}
    assert [(p.demand, p.reservation) for p in swapped.placements] == [("g1", "r2")]


def test_a_reservation_is_honoured_in_whole_blocks_and_failed_gpus_do_not_count():
    """12 working GPUs: r1 (8 in blocks of 8) is honoured whole, r2's 8 in blocks of 8 find
    only 4 left, not a block, so it is short of all 8; r3 in blocks of 2 takes 4 of the 4."""
    _, result = planned(
        nodes=[Node("n001", 8), Node("n002", 8, failed_gpus=(4, 5, 6, 7))],
        reservations=[
            Reservation("r1", "acme", 8, 8),
            Reservation("r2", "globex", 8, 8),
            Reservation("r3", "initech", 6, 2),
        ],
    )
    assert shortfalls(result) == {"r1": (8, 0), "r2": (8, 8), "r3": (6, 2)}


def test_a_file_asking_more_than_the_set_is_read_and_planned():
    data = snapshot_to_dict(snapshot(nodes=[Node("n001", 8), Node("n002", 8, "down")]))
    data["reservations"] = [{"id": "r1", "tenant": "acme", "gpus": 64, "block_gpus": 8}]
    fleet = snapshot_from_dict(data)
    assert shortfalls(plan(fleet)) == {"r1": (64, 56)}
