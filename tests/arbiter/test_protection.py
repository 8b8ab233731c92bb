"""Protection windows (rule 3a): a VM that started or resumed less than its pool's
``protect_seconds`` ago is no victim while any other complete plan exists; when only protected
VMs could serve a demand, it waits, and says until when."""

import dataclasses
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucap.arbiter import dump_plan, load_snapshot, plan, snapshot_problems
from gpucap.arbiter.codec import SnapshotError, snapshot_from_dict, snapshot_to_dict
from gpucap.arbiter.model import Pool, Snapshot
from gpucap.arbiter.protection import explain_waits, protected_vms
from tests.arbiter.fleets import at, demand, snapshot, snapshots, standard_pools, vm
from tests.arbiter.rules import rule_violations

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEN_MINUTES = 600


def protecting(seconds: int, *, spot_floor: int = 0) -> list[Pool]:
    """The standard pools, spot protecting its VMs for ``seconds``."""
    pools = standard_pools(spot_floor=spot_floor)
    return [
        dataclasses.replace(pool, protect_seconds=seconds) if pool.name == "spot" else pool
        for pool in pools
    ]


def unprotected(snapshot: Snapshot) -> Snapshot:
    pools = tuple(dataclasses.replace(pool, protect_seconds=0) for pool in snapshot.pools)
    return dataclasses.replace(snapshot, pools=pools)


def check_protection(snapshot: Snapshot) -> None:
    assert snapshot_problems(snapshot) == []
    result = plan(snapshot)
    assert rule_violations(snapshot, result) == []
    protected = protected_vms(snapshot)
    assert not [p.vm for p in result.preemptions if p.vm in protected]
    waiting = {u.group: u.waits_until for u in result.unsatisfied if u.waits_until}
    if not waiting:
        return
    # A wait blamed on protection is real: without protection the group is served...
    served_without = {d.group for d in snapshot.demands} - {
        u.group for u in plan(unprotected(snapshot)).unsatisfied
    }
    assert set(waiting) <= served_without
    for group, until in waiting.items():
        assert until > snapshot.now
        assert until in protected.values()
        # ...and so it is once time has come to the moment the wait names.
        later = plan(dataclasses.replace(snapshot, now=until))
        assert group not in {u.group for u in later.unsatisfied}, (group, until)


@PROPERTY
@given(snapshots(fabric="nvswitch"))
def test_nvswitch_no_protected_vm_is_a_victim_and_every_protected_wait_ends(snapshot):
    check_protection(snapshot)


@PROPERTY
@given(snapshots(fabric="pcie"))
def test_pcie_no_protected_vm_is_a_victim_and_every_protected_wait_ends(snapshot):
    check_protection(snapshot)


def protecting_everywhere(snapshot: Snapshot) -> Snapshot:
    """Every pool protects (those without a window get 500 minutes: about 60 % of the VMs of
    the random sets are then protected), so that many demands wait for protection."""
    pools = tuple(
        dataclasses.replace(pool, protect_seconds=pool.protect_seconds or 500 * 60)
        for pool in snapshot.pools
    )
    return dataclasses.replace(snapshot, pools=pools)


@pytest.mark.parametrize("fabric", ["nvswitch", "pcie"])
@PROPERTY
@given(data=st.data())
def test_crowded_protected_sets_wait_only_for_protection_that_ends(fabric, data):
    snapshot = data.draw(
        snapshots(fabric=fabric, max_nodes=4, max_demands=10, max_groups=3, crowded=True)
    )
    check_protection(protecting_everywhere(snapshot))


@PROPERTY
@given(snapshots(max_nodes=4, max_demands=10, max_groups=3, crowded=True, max_jobs=2, tenancy=True))
def test_protected_waits_end_with_quotas_and_dedicated_nodes_too(snapshot):
    check_protection(protecting_everywhere(snapshot))


def two_spot_vms(**overrides):
    """One node: a spot VM that resumed 2 minutes ago on GPUs 0-3 and one that has run for
    hours on GPUs 4-7 (so rule 7 alone would pick the fresh one: it lost least work)."""
    fields = {
        "pools": protecting(TEN_MINUTES),
        "vms": [
            vm("fresh", "spot", "n001", (0, 1, 2, 3), minute=598),
            vm("old", "spot", "n001", (4, 5, 6, 7), minute=10),
        ],
        "demands": [demand("d1", "rent", 4)],
    }
    fields.update(overrides)
    return snapshot(**fields)


def test_rule_7_alone_reclaims_the_freshest_vm():
    result = plan(two_spot_vms(pools=standard_pools()))
    assert [p.vm for p in result.preemptions] == ["fresh"]


def test_a_protected_vm_is_passed_over_for_an_unprotected_one():
    result = plan(two_spot_vms())
    assert [p.vm for p in result.preemptions] == ["old"]
    assert result.complete


def test_a_protected_vm_is_passed_over_even_for_a_dearer_reclaim():
    """Protection is a hard rule: an unprotected reclaim of more GPUs beats a protected one."""
    snap = two_spot_vms(
        vms=[
            vm("fresh", "spot", "n001", (0, 1, 2, 3), minute=598),
            vm("old", "spot", "n002", (0, 1, 2, 3, 4, 5, 6, 7), minute=10),
        ],
        nodes=[*snapshot().nodes, dataclasses.replace(snapshot().nodes[0], name="n002")],
        demands=[demand("d1", "rent", 4)],
    )
    # n001's GPUs 4-7 are free: fill them so a reclaim is needed.
    snap = dataclasses.replace(
        snap, vms=(*snap.vms, vm("held", "rent", "n001", (4, 5, 6, 7), minute=10))
    )
    result = plan(snap)
    assert [p.vm for p in result.preemptions] == ["old"]


def test_when_only_protected_vms_could_serve_the_demand_waits_until_their_protection_ends():
    snap = two_spot_vms(
        vms=[vm("fresh", "spot", "n001", tuple(range(8)), minute=598)],
        demands=[demand("d1", "rent", 4)],
    )
    result = plan(snap)
    assert result.preemptions == () and not result.complete
    (waiting,) = result.unsatisfied
    assert waiting.waits_until == at(608)
    assert waiting.reason == (
        "waits: the VMs it could reclaim are protected until 18:08 UTC (pool spot protects VMs "
        "for 600 s after they start or resume)"
    )
    later = plan(dataclasses.replace(snap, now=at(608)))
    assert [p.vm for p in later.preemptions] == ["fresh"]
    assert later.complete


def test_the_wait_names_the_latest_protection_the_plan_needs_to_end():
    """Two fresh VMs both stand in the way of an 8-GPU demand: it waits for the later one."""
    snap = two_spot_vms(
        vms=[
            vm("a", "spot", "n001", (0, 1, 2, 3), minute=595),
            vm("b", "spot", "n001", (4, 5, 6, 7), minute=599, tenant="acme"),
        ],
        demands=[demand("d1", "rent", 8)],
    )
    (waiting,) = plan(snap).unsatisfied
    assert waiting.waits_until == at(609)
    assert "protected until 18:09 UTC" in waiting.reason


def test_seconds_and_another_day_show_in_the_wait():
    snap = two_spot_vms(
        pools=protecting(TEN_MINUTES + 30 + 24 * 3600),
        vms=[vm("fresh", "spot", "n001", tuple(range(8)), minute=598)],
    )
    (waiting,) = plan(snap).unsatisfied
    assert "protected until 2026-11-30 18:08:30 UTC" in waiting.reason


def test_a_wait_that_protection_does_not_cause_keeps_its_reason():
    """An on-demand VM blocks the node: protection ending would not help."""
    snap = two_spot_vms(
        vms=[
            vm("fresh", "spot", "n001", (0, 1, 2, 3), minute=598),
            vm("rented", "rent", "n001", (4, 5, 6, 7), minute=10),
        ],
        demands=[demand("d1", "rent", 8)],
    )
    (waiting,) = plan(snap).unsatisfied
    assert waiting.waits_until is None
    assert "protected until" not in waiting.reason
    assert "only on-demand VMs hold the candidate partitions" in waiting.reason


def test_partitions_held_by_protected_vms_are_counted_as_such_when_the_wait_is_not_theirs():
    """A floor stops the reclaim of the unprotected VM, and would stop the protected one's
    too: the wait is the floor's, and the count names the protected partition."""
    snap = two_spot_vms(
        pools=protecting(TEN_MINUTES, spot_floor=4),
        vms=[
            vm("fresh", "spot", "n001", (0, 1, 2, 3), minute=598),
            vm("old", "spot", "n001", (4, 5, 6, 7), minute=10),
        ],
        demands=[demand("d1", "rent", 8)],
    )
    (waiting,) = plan(snap).unsatisfied
    assert waiting.waits_until is None
    assert "every candidate is held by a VM its pool still protects" in waiting.reason


def test_protection_ends_exactly_at_start_plus_protect_seconds():
    snap = two_spot_vms(vms=[vm("fresh", "spot", "n001", tuple(range(8)), minute=590)])
    assert protected_vms(snap) == {}
    assert [p.vm for p in plan(snap).preemptions] == ["fresh"]


def test_without_now_nothing_is_protected():
    snap = dataclasses.replace(two_spot_vms(), now=None)
    assert protected_vms(snap) == {}
    assert [p.vm for p in plan(snap).preemptions] == ["fresh"]


def test_notified_and_on_demand_vms_are_not_listed_as_protected():
    pools = [dataclasses.replace(pool, protect_seconds=TEN_MINUTES) for pool in standard_pools()]
    snap = two_spot_vms(
        pools=pools,
        vms=[
            vm("leaving", "spot", "n001", (0, 1, 2, 3), minute=598, state="notified"),
            vm("rented", "rent", "n001", (4, 5), minute=598),
            vm("replica", "chat", "n001", (6, 7), minute=598),
        ],
    )
    assert set(protected_vms(snap)) == {"replica"}


def test_the_snapshot_file_carries_protect_seconds_and_the_plan_waits_until():
    snap = two_spot_vms(vms=[vm("fresh", "spot", "n001", tuple(range(8)), minute=598)])
    data = snapshot_to_dict(snap)
    assert [pool.get("protect_seconds") for pool in data["pools"]] == [None, None, TEN_MINUTES]
    assert snapshot_from_dict(data) == snap
    text = dump_plan(plan(load_snapshot(__import__("json").dumps(data))))
    assert '"waits_until": "2026-11-29T18:08:00Z"' in text


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (-1, "protect_seconds must be 0..604800, got -1"),
        (604801, "protect_seconds must be 0..604800, got 604801"),
        (1.5, "protect_seconds must be an integer, got 1.5"),
        ("600", 'protect_seconds must be an integer, got "600"'),
    ],
)
def test_a_bad_protect_seconds_is_named(value, problem):
    data = snapshot_to_dict(two_spot_vms())
    data["pools"][2]["protect_seconds"] = value
    with pytest.raises(SnapshotError) as caught:
        snapshot_from_dict(data)
    assert any(problem in line for line in caught.value.problems), caught.value.problems


def test_protect_seconds_up_to_seven_days_is_accepted():
    data = snapshot_to_dict(two_spot_vms())
    data["pools"][2]["protect_seconds"] = 7 * 24 * 3600
    assert snapshot_from_dict(data).pools[2].protect_seconds == 604800


def test_time_past_the_protection_of_every_vm_plans_as_without_protection():
    snap = two_spot_vms()
    later = dataclasses.replace(snap, now=snap.now + timedelta(seconds=TEN_MINUTES))
    assert dump_plan(plan(later)) == dump_plan(plan(unprotected(later)))


def test_a_wait_no_protected_vm_could_end_is_not_planned_twice():
    """Only chat (rank 1) protects, and the waiting demand is rent's (rank 2): rule 3 keeps it
    from chat's VMs anyway, so no plan without protection is made to time the wait."""
    pools = [
        dataclasses.replace(pool, protect_seconds=TEN_MINUTES) if pool.name == "chat" else pool
        for pool in standard_pools()
    ]
    snap = two_spot_vms(
        pools=pools,
        vms=[vm("replica", "chat", "n001", tuple(range(8)), minute=598)],
        demands=[demand("d1", "rent", 8)],
    )
    result = plan(snap)
    assert protected_vms(snap) == {"replica": at(608)}
    (waiting,) = result.unsatisfied
    assert waiting.waits_until is None and "rank" in waiting.reason

    def second_plan():
        raise AssertionError("planned again without protection")

    assert explain_waits(snap, result, second_plan) is result
