"""Reservations and quotas in simulated time, on the hand-checked set (tests/simulation/sets.py):
a reservation's window opens and closes at its minutes, its claim reclaims the borrowers the
live plan would, and the start's quotas hold throughout."""

from dataclasses import replace
from datetime import time

from gpucap.arbiter.model import Pool, Quota, Reservation
from gpucap.schedules.calendar import Window
from gpucap.simulation import Curve, Profile, VmArrivals
from gpucap.simulation.reservations import ReservationSpec
from tests.simulation.sets import T0, chat_load, full_set, minute
from tests.simulation.test_engine import notices_at, run

NINE_TO_TEN = Window(frozenset({T0.weekday()}), time(9, 0), time(10, 0), "UTC")  # minutes 60-120


def arrivals(at_minute: int, count: int, gpus: int, tenant: str) -> VmArrivals:
    """``count`` VMs of ``tenant`` asked at ``at_minute`` (one a minute), running for hours."""
    rate = Curve(((0.0, 0.0), (at_minute * 60.0, 60.0), ((at_minute + count) * 60.0, 0.0)), "step")
    return VmArrivals(rate, gpus_per_vm=gpus, duration_seconds=6 * 3600, tenant=tenant)


def lab_set():
    """n3 free, and umbrella's own spot pool ``lab`` ranked below spot (it reclaims nobody)."""
    full = full_set()
    return replace(
        full,
        pools=(*full.pools, Pool("lab", "spot", 4)),
        vms=tuple(vm for vm in full.vms if vm.id not in ("spot-3", "spot-4")),
    )


def globex_then_umbrella() -> Profile:
    """globex asks for a node of spot at 09:10, umbrella for a node of lab at 09:30."""
    return Profile(
        deployments=chat_load((0, 4)).deployments,
        pools={"spot": arrivals(70, 1, 8, "globex"), "lab": arrivals(90, 1, 8, "umbrella")},
    )


def umbrella(window: Window | None = NINE_TO_TEN) -> ReservationSpec:
    return ReservationSpec(Reservation("7", "umbrella", gpus=8, block_gpus=8), window)


def test_a_reservation_in_force_from_its_window_is_kept_lent_then_claimed():
    result = run(
        start=lab_set(),
        profile=globex_then_umbrella(),
        reservations=[umbrella()],
        duration_seconds=3 * 3600,
    )
    plans = {made.step: made for made in result.plans}
    # 09:00: the window opens and the set is planned: n3 is kept for umbrella.
    assert plans[60].snapshot.reservations == (umbrella().reservation,)
    assert plans[60].plan.reservations[0].kept_gpus == 8
    # 09:10: globex's spot VM may only borrow it.
    (placed,) = plans[70].plan.placements
    assert (placed.node, placed.borrowed) == ("n3", "7")
    # 09:30: umbrella claims its reservation: the borrower gets the notice, whatever its rank.
    assert notices_at(result, 90) == ["sim-spot-vm-1"]
    assert next(e.at for e in result.events if e.kind == "notice") == minute(90)
    (claim,) = plans[90].plan.placements
    assert (claim.demand, claim.node, claim.reservation) == ("sim-lab-vm-2", "n3", "7")
    offs = [(e.vm, e.at) for e in result.events if e.kind == "off"]
    assert offs[0] == ("sim-spot-vm-1", minute(95))  # after the notice's 300 s
    words = [(e.at, e.reason) for e in result.events if e.kind == "reservation"]
    assert words == [
        (minute(60), "reservation 7 (umbrella, 8 GPUs) in force"),
        (minute(120), "reservation 7 (umbrella, 8 GPUs) ended"),
    ]


def test_before_its_window_opens_a_reservation_keeps_nothing():
    early = run(start=lab_set(), profile=globex_then_umbrella(), reservations=[umbrella()])
    assert all(made.snapshot.reservations == () for made in early.plans if made.step < 60)
    unreserved = run(start=lab_set(), profile=globex_then_umbrella(), reservations=[])
    (placed,) = {made.step: made for made in unreserved.plans}[70].plan.placements
    assert (placed.node, placed.borrowed) == ("n3", None)
    assert [e for e in unreserved.events if e.kind in ("notice", "reservation")] == []


def test_a_window_that_closed_before_the_tenant_asks_claims_nothing_and_clears_the_flags():
    short = Window(frozenset({T0.weekday()}), time(9, 0), time(9, 20), "UTC")
    result = run(start=lab_set(), profile=globex_then_umbrella(), reservations=[umbrella(short)])
    assert [(e.at, e.reason) for e in result.events if e.kind == "reservation"][-1] == (
        minute(80),
        "reservation 7 (umbrella, 8 GPUs) ended",
    )
    assert [e for e in result.events if e.kind == "notice"] == []
    later = {made.step: made.snapshot for made in result.plans}[90]
    assert [vm.borrowed for vm in later.vms if vm.id == "sim-spot-vm-1"] == [None]


def test_without_windows_the_starts_reservations_stay_in_force():
    start = replace(lab_set(), reservations=(umbrella().reservation,))
    result = run(start=start, profile=globex_then_umbrella())
    assert notices_at(result, 90) == ["sim-spot-vm-1"]


def test_the_starts_quotas_hold_at_every_step():
    free_n3 = replace(
        full_set(), vms=tuple(vm for vm in full_set().vms if vm.id not in ("spot-3", "spot-4"))
    )
    profile = Profile(
        deployments=chat_load((0, 4)).deployments,
        pools={"spot": arrivals(5, 2, 4, "umbrella")},
    )
    unlimited = run(start=free_n3, profile=profile)
    capped = run(start=replace(free_n3, quotas=(Quota("umbrella", None, 4),)), profile=profile)
    umbrella = [
        [vm for vm in made.snapshot.vms if vm.tenant == "umbrella"] for made in unlimited.plans[-1:]
    ]
    assert umbrella  # the last plan saw umbrella's VMs
    spot = [next(p.held_gpus for p in s.pools if p.pool == "spot") for s in unlimited.steps]
    assert spot[-1] == 16  # two of umbrella's 4-GPU VMs beside globex's two on n2
    spot = [next(p.held_gpus for p in s.pools if p.pool == "spot") for s in capped.steps]
    assert max(spot) == 12  # one, never past its quota of 4 GPUs
