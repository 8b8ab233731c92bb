"""What a reservation's tenant uses is held inside it (rule 4 of reservations, held.py), checked
by hand on sets small enough to work out on paper: while the reservation is in force, the
tenant's running VMs up to its GPUs are no victims of anyone, its VMs beyond are ordinary, and a
demand only they keep waiting says so. The properties over random sets are in
test_reservation_rules.py (the referee's rule 4 is in reserved.py)."""

import dataclasses

from gpucap.arbiter import plan
from gpucap.arbiter.codec import plan_to_dict, snapshot_from_dict, snapshot_to_dict
from gpucap.arbiter.model import Node, Pool, Reservation
from tests.arbiter.fleets import demand, snapshot, standard_pools, vm
from tests.arbiter.rules import rule_violations

ALL = tuple(range(8))
LOW, HIGH = (0, 1, 2, 3), (4, 5, 6, 7)
LAB = [*standard_pools(), Pool("lab", "spot", 4)]  # chat 1, rent 2 (on-demand), spot 3, lab 4
R8 = Reservation("r1", "acme", 8, 8)


def planned(**fleet):
    fleet = snapshot(**fleet)
    result = plan(fleet)
    assert rule_violations(fleet, result) == []
    return fleet, result


def victims(result) -> list[str]:
    return [p.vm for p in result.preemptions]


def held_words(*holders: str) -> str:
    verb = "it is" if len(holders) == 1 else "they are"
    noun = "a reservation" if len(holders) == 1 else "reservations"
    return (
        f"waits: the VMs it could reclaim are held inside {noun}: {', '.join(holders)}; they "
        f"are not reclaimed while {verb} in force"
    )


def test_a_vm_its_claim_placed_is_not_reclaimed_by_a_higher_ranked_demand():
    """The bug of the simulated 09:35: a spot demand (rank 3) would reclaim the lab VM (rank 4)
    umbrella's claim had just placed inside its reservation."""
    fleet, result = planned(
        nodes=[Node("n001", 8), Node("n002", 8)],
        pools=LAB,
        vms=[
            vm("o1", "rent", "n001", ALL, tenant="initech"),
            vm("u1", "lab", "n002", ALL, minute=590, tenant="umbrella", reservation="7"),
        ],
        demands=[demand("g1", "spot", 8, tenant="globex")],
        reservations=[Reservation("7", "umbrella", 8, 8)],
    )
    assert (result.placements, result.preemptions) == ((), ())
    (wait,) = result.unsatisfied
    assert wait.reason == held_words("tenant umbrella holds 8 GPUs inside its reservation 7")
    (report,) = plan_to_dict(result)["reservations"]
    assert (report["held_before"], report["held_after"], report["kept_gpus"]) == (8, 8, 0)
    # Once the reservation ends, the VM is ordinary: rank decides.
    ended = plan(dataclasses.replace(fleet, reservations=()))
    assert victims(ended) == ["u1"]


def test_claimed_vms_are_held_first_then_the_oldest_and_the_rest_are_ordinary():
    vms = [
        vm("a0", "spot", "n001", LOW, minute=10, tenant="acme"),
        # The newest, so rule 7 alone would reclaim it; but a claim placed it inside r1.
        vm("a1", "spot", "n001", HIGH, minute=40, tenant="acme", reservation="r1"),
        vm("a2", "spot", "n002", LOW, minute=30, tenant="acme"),
        vm("o1", "rent", "n002", HIGH, tenant="initech"),
    ]
    fleet, result = planned(
        nodes=[Node("n001", 8), Node("n002", 8)],
        vms=vms,
        demands=[demand("g1", "chat", 4, tenant="globex")],
        reservations=[Reservation("r1", "acme", 8, 4)],
    )
    # Held: a1 (its claim's), then a0 (the oldest): 8 GPUs. a2, beyond them, is ordinary.
    assert victims(result) == ["a2"]
    assert plan_to_dict(result)["reservations"][0]["held_after"] == 8
    # Without the claim's flag, the two oldest are held, and the newest is reclaimed.
    unflagged = dataclasses.replace(
        fleet, vms=tuple(dataclasses.replace(v, reservation=None) for v in fleet.vms)
    )
    assert victims(plan(unflagged)) == ["a1"]


def test_a_flag_naming_another_reservation_counts_for_nothing():
    _, result = planned(
        nodes=[Node("n001", 8), Node("n002", 8)],
        vms=[
            vm("a0", "spot", "n001", LOW, minute=10, tenant="acme"),
            vm("a1", "spot", "n001", HIGH, minute=40, tenant="acme", reservation="ended"),
            vm("o1", "rent", "n002", ALL, tenant="initech"),
        ],
        demands=[demand("g1", "chat", 4, tenant="globex")],
        reservations=[Reservation("r1", "acme", 4, 4)],
    )
    assert victims(result) == ["a1"]  # a0 is the oldest: held; a1 is ordinary


def test_a_vm_is_held_whole_even_past_the_reservation():
    _, result = planned(
        nodes=[Node("n001", 8), Node("n002", 8)],
        vms=[
            vm("a0", "spot", "n001", ALL, tenant="acme"),
            vm("o1", "rent", "n002", ALL, tenant="initech"),
        ],
        demands=[demand("g1", "chat", 8, tenant="globex")],
        reservations=[Reservation("r1", "acme", 4, 4)],
    )
    # Reclaiming a0 would take acme from 8 GPUs to none, below the 4 promised: it is held.
    assert victims(result) == []
    assert result.unsatisfied[0].reason == held_words(
        "tenant acme holds 8 GPUs inside its reservation r1"
    )


def test_not_even_the_tenants_own_higher_ranked_demand_reclaims_what_is_held():
    nodes = [Node("n001", 8), Node("n002", 8)]
    _, alone = planned(
        nodes=nodes,
        vms=[
            vm("a0", "spot", "n001", ALL, tenant="acme"),
            vm("o1", "rent", "n002", ALL, tenant="initech"),
        ],
        demands=[demand("a9", "chat", 8, tenant="acme")],
        reservations=[R8],
    )
    assert victims(alone) == []
    assert alone.unsatisfied[0].reason == held_words(
        "tenant acme holds 8 GPUs inside its reservation r1"
    )
    # A VM of acme's beyond its reservation is ordinary: acme's own demand may reclaim it.
    _, beyond = planned(
        nodes=nodes,
        vms=[
            vm("a0", "spot", "n001", ALL, minute=10, tenant="acme"),
            vm("a1", "spot", "n002", ALL, minute=20, tenant="acme"),
        ],
        demands=[demand("a9", "chat", 8, tenant="acme")],
        reservations=[R8],
    )
    assert victims(beyond) == ["a1"]


def test_a_vm_borrowing_another_reservation_is_never_held():
    _, result = planned(
        nodes=[Node("n001", 8), Node("n002", 8)],
        vms=[
            # acme's own spot VM sits on capacity kept for globex's r2.
            vm("b1", "spot", "n001", ALL, minute=10, tenant="acme", borrowed="r2"),
            vm("a1", "spot", "n002", ALL, minute=20, tenant="acme"),
        ],
        demands=[demand("g1", "spot", 8, tenant="globex")],
        reservations=[R8, Reservation("r2", "globex", 8, 8)],
    )
    # globex's claim reclaims the borrower (the oldest of acme's, yet not held); a1 is held.
    assert [(p.demand, p.node, p.reservation) for p in result.placements] == [("g1", "n001", "r2")]
    assert victims(result) == ["b1"]
    assert [r.held_after for r in result.reservations] == [8, 8]


def test_a_running_job_with_a_held_member_is_kept_whole():
    _, result = planned(
        nodes=[Node("n001", 8), Node("n002", 8)],
        vms=[
            vm("j0", "spot", "n001", LOW, minute=10, tenant="acme", group="acme/train"),
            vm("j1", "spot", "n002", LOW, minute=20, tenant="acme", group="acme/train"),
            vm("o1", "rent", "n001", HIGH, tenant="initech"),
            vm("o2", "rent", "n002", HIGH, tenant="initech"),
        ],
        demands=[demand("g1", "chat", 4, tenant="globex")],
        reservations=[Reservation("r1", "acme", 4, 4)],
    )
    # j0 is held; j1 is beyond the reservation, but its job goes whole or not at all.
    assert victims(result) == []
    assert result.unsatisfied[0].reason == held_words(
        "tenant acme holds 4 GPUs inside its reservation r1"
    )


def test_a_wait_held_vms_do_not_cause_keeps_the_planners_words():
    _, result = planned(
        nodes=[Node("n001", 8)],
        pools=LAB,
        vms=[vm("a0", "spot", "n001", ALL, tenant="acme")],
        demands=[demand("g1", "spot", 8, tenant="globex")],
        reservations=[R8],
    )
    # The same rank as a0: rule 3 would keep it anyway; the words say what holds the node.
    assert result.unsatisfied[0].reason == (
        "no node has a free or reclaimable 8-GPU partition: every candidate is held by VMs held "
        "inside tenants' reservations, which are not reclaimed while those are in force"
    )


def test_a_claim_would_not_reclaim_what_another_reservation_holds():
    _, result = planned(
        nodes=[Node("n001", 8), Node("n002", 8), Node("n003", 8)],
        vms=[
            vm("g0", "spot", "n001", ALL, tenant="globex"),
            vm("s1", "spot", "n002", ALL, tenant="initech"),
            vm("o1", "rent", "n003", ALL, tenant="initech"),
        ],
        reservations=[Reservation("r1", "acme", 16, 8), Reservation("r2", "globex", 8, 8)],
    )
    acme = plan_to_dict(result)["reservations"][0]
    # Claiming acme's 16 GPUs would take initech's spot VM, never g0, held inside r2.
    assert (acme["claim_reclaims"], acme["claim_complete"]) == (["s1"], False)
    assert acme["borrowed"] == ["s1"]


def test_two_reservations_holding_what_a_demand_needs_are_both_named():
    _, result = planned(
        nodes=[Node("n001", 8)],
        vms=[
            vm("a0", "spot", "n001", LOW, tenant="acme"),
            vm("g0", "spot", "n001", HIGH, tenant="globex"),
        ],
        demands=[demand("i1", "chat", 8, tenant="initech")],
        reservations=[Reservation("r1", "acme", 4, 4), Reservation("r2", "globex", 4, 4)],
    )
    assert result.unsatisfied[0].reason == held_words(
        "tenant acme holds 4 GPUs inside its reservation r1",
        "tenant globex holds 4 GPUs inside its reservation r2",
    )


def test_a_vms_reservation_flag_is_read_and_written_by_the_snapshot_file():
    fleet = snapshot(
        vms=[vm("a1", "spot", "n001", ALL, tenant="acme", reservation="r1")],
        reservations=[R8],
    )
    data = snapshot_to_dict(fleet)
    assert data["vms"][0]["reservation"] == "r1"
    assert snapshot_from_dict(data) == fleet
    del data["vms"][0]["reservation"]
    assert snapshot_from_dict(data).vms[0].reservation is None
