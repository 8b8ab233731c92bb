"""A property: whatever the set, the load and the schedule, every plan the simulation asks of
the arbiter is made from a sound snapshot and obeys the arbiter's rules (tests/arbiter/rules.py
is the referee), and the simulated set never gives a GPU twice."""

from dataclasses import replace
from datetime import time, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucap.arbiter import snapshot_problems
from gpucap.schedules.calendar import (
    FLOOR_GPUS,
    MIN_REPLICAS,
    RANK_ORDER,
    Change,
    Entry,
    Window,
)
from gpucap.simulation import Curve, DeploymentLoad, DeploymentSpec, Profile, VmArrivals, simulate
from tests.arbiter.fleets import at, snapshots
from tests.arbiter.rules import rule_violations


@st.composite
def simulations(draw):
    start = draw(snapshots(max_nodes=4, max_demands=3, max_jobs=1, crowded=draw(st.booleans())))
    sizes = (1,) if start.capacity_set.fabric == "pcie" else (1, 2, 4, 8)
    specs = {}
    loads = {}
    for deployment in start.deployments:
        low = deployment.min_replicas
        specs[deployment.name] = DeploymentSpec(
            pool=deployment.pool,
            gpus_per_replica=draw(st.sampled_from(sizes)),
            min_replicas=low,
            max_replicas=low + draw(st.integers(0, 3)),
            target_in_flight=2,
            replica_concurrency=4,
            queue_limit=draw(st.sampled_from((0, 8, 64))),
            scale_down_cooldown_seconds=draw(st.sampled_from((0, 120, 600))),
        )
        points = draw(
            st.lists(st.floats(0, 20, allow_nan=False), min_size=1, max_size=4).map(
                lambda rates: tuple((index * 600.0, rate) for index, rate in enumerate(rates))
            )
        )
        loads[deployment.name] = DeploymentLoad(
            Curve(points, draw(st.sampled_from(("linear", "step")))), service_seconds=1.0
        )
    arrivals = {}
    # Mostly the best-ranked pools: their VMs may reclaim, so plans preempt and VMs resume.
    for pool in draw(st.lists(st.sampled_from(start.pools[:2]), max_size=2, unique=True)):
        arrivals[pool.name] = VmArrivals(
            Curve(((0.0, draw(st.sampled_from((6.0, 30.0, 120.0)))),)),
            gpus_per_vm=draw(st.sampled_from(sizes)),
            duration_seconds=draw(st.sampled_from((300, 1200))),
        )
    entries = []
    if draw(st.booleans()):
        opens = start.now + timedelta(minutes=draw(st.integers(1, 30)))
        pool = draw(st.sampled_from(start.pools))
        changes = [Change(FLOOR_GPUS, pool.name, draw(st.sampled_from((0, 2, 8, 16))))]
        changes += [Change(MIN_REPLICAS, name, 1) for name in specs][:1]
        if draw(st.booleans()):  # the two best-ranked pools swap places
            changes.append(Change(RANK_ORDER, "", (start.pools[1].name, start.pools[0].name)))
        window = Window(frozenset({opens.weekday()}), opens.time(), time(23, 59), "UTC")
        entries.append(Entry("shift", window, tuple(changes)))
    return start, Profile(deployments=loads, pools=arrivals), specs, entries


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(simulations(), st.sampled_from((0, 120, 300)))
def test_every_plan_of_a_simulation_obeys_the_arbiters_rules(case, notice_seconds):
    start, profile, specs, entries = case
    result = simulate(
        start,
        profile,
        deployments=specs,
        entries=entries,
        notice_seconds=notice_seconds,
        duration_seconds=60 * 60,
        startup_seconds=60,
        keep_plans=True,
    )
    for made in result.plans:
        assert snapshot_problems(made.snapshot) == [], f"step {made.step}"
        assert rule_violations(made.snapshot, made.plan) == [], f"step {made.step}"
    for step in result.steps:
        for pool in step.pools:
            assert pool.held_gpus >= 0
    assert start.now == at(600)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(simulations(), st.sampled_from((0, 120, 300)))
def test_planning_only_when_something_changed_misses_nothing(case, notice_seconds):
    start, profile, specs, entries = case
    options = {
        "deployments": specs,
        "entries": entries,
        "notice_seconds": notice_seconds,
        "duration_seconds": 60 * 60,
        "startup_seconds": 60,
    }
    lazy = simulate(start, profile, **options)
    eager = simulate(start, profile, plan_every_step=True, **options)
    assert lazy.events == eager.events
    assert [replace(step, planned=False) for step in lazy.steps] == [
        replace(step, planned=False) for step in eager.steps
    ]
