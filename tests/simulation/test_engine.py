"""The simulation on a set small enough to check by hand (tests/simulation/sets.py)."""

from dataclasses import replace
from datetime import UTC, datetime, time, timedelta

import pytest

from gpucap.arbiter import plan
from gpucap.arbiter.model import Demand
from gpucap.schedules.calendar import FLOOR_GPUS, Change, Entry, Window
from gpucap.simulation import Curve, Profile, SimulationError, VmArrivals, simulate
from gpucap.simulation.worst import WorstMoments
from tests.simulation.sets import CHAT, T0, chat_load, full_set, minute

NOTICE = 300


def run(start=None, profile=None, **options):
    options = {
        "deployments": {"chat": CHAT},
        "notice_seconds": NOTICE,
        "duration_seconds": 2 * 3600,
        "startup_seconds": 60,
        "keep_plans": True,
        **options,
    }
    return simulate(start or full_set(), profile or chat_load((0, 4), (10, 12), (60, 4)), **options)


def notices_at(result, step):
    return sorted(e.vm for e in result.events if e.kind == "notice" and e.at == minute(step))


def test_a_load_step_needing_two_more_replicas_reclaims_exactly_the_spot_vms_the_dry_run_names():
    result = run()
    # 12 requests/s from minute 10: the autoscaler sees them at minute 11 and asks for two more.
    step = result.steps[11]
    assert [(d.desired, d.replicas) for d in step.deployments] == [(3, 3)]
    assert step.notices == 2
    # The dry run, by hand: today's set with the two replicas asked for, planned at minute 11.
    asked = tuple(
        Demand(f"chat-new-{n}", "scale-up", "chat", 4, requested_at=minute(11)) for n in (1, 2)
    )
    dry_run = plan(replace(full_set(), demands=asked, now=minute(11)))
    named = sorted(preemption.vm for preemption in dry_run.preemptions)
    assert named == ["spot-3", "spot-4"]  # the two most recently started
    assert notices_at(result, 11) == named
    assert all(e.kind != "notice" for e in result.events if e.at != minute(11))


def test_a_notice_frees_the_victims_gpus_after_notice_seconds_and_the_replicas_start_then():
    result = run()
    chat_gpus = [next(p.held_gpus for p in s.pools if p.pool == "chat") for s in result.steps]
    assert chat_gpus[11:16] == [4] * 5  # still waiting for spot-3 and spot-4 to leave
    assert chat_gpus[16] == 12  # 300 s after the notices
    offs = [(e.vm, e.at) for e in result.events if e.kind == "off"]
    assert offs == [("spot-3", minute(16)), ("spot-4", minute(16))]
    # Ready a minute after they start.
    assert [s.deployments[0].ready for s in result.steps[15:18]] == [1, 1, 3]


def test_a_reclaimed_spot_vm_resumes_on_its_disks_node_when_capacity_returns():
    result = run()
    # Load falls to 4/s at minute 60: fewer replicas would do from minute 61, and after the
    # cool-down of 600 s the two extra replicas go, so the spot VMs run again at minute 71.
    resumes = [(e.vm, e.node, e.at) for e in result.events if e.kind == "resume"]
    assert resumes == [("spot-3", "n3", minute(71)), ("spot-4", "n3", minute(71))]
    spot = [next(p.held_gpus for p in s.pools if p.pool == "spot") for s in result.steps]
    assert spot[10] == 16 and spot[11] == 8 and spot[70] == 8 and spot[71] == 16
    assert result.steps[71].resumes == 2


def test_a_schedule_boundary_inside_the_window_changes_the_floor_at_that_minute():
    window = Window(frozenset({T0.weekday()}), time(8, 30), time(9, 30), "UTC")
    keep_spot = Entry("keep-spot", window, (Change(FLOOR_GPUS, "spot", 16),))
    result = run(entries=[keep_spot], profile=chat_load((0, 4), (40, 12), (100, 4)))
    floors = [next(p.floor_gpus for p in s.pools if p.pool == "spot") for s in result.steps]
    assert floors[29] == 0 and floors[30:90] == [16] * 60 and floors[90] == 0
    policy = [(e.at, e.reason) for e in result.events if e.kind == "policy"]
    assert policy == [
        (minute(30), "pool spot floor 0 → 16 GPUs"),
        (minute(90), "pool spot floor 16 → 0 GPUs"),
    ]
    # The floor keeps chat's scale-up at minute 41 waiting until it closes at 09:30.
    notices = sorted({e.at for e in result.events if e.kind == "notice"})
    assert notices == [minute(90)]


def test_the_same_input_gives_the_same_result():
    assert run() == run()


def test_with_nothing_to_place_the_arbiter_is_not_asked():
    result = run(profile=chat_load((0, 4)))
    assert result.plans_made == 0
    assert {e.kind for e in result.events} == set()


def test_a_queue_builds_while_replicas_start_and_its_wait_is_measured():
    spec = replace(CHAT, replica_concurrency=8, max_replicas=3)
    result = run(deployments={"chat": spec})
    # 12/s on one replica serving 8/s: 4 more a second queue, 240 in the minute, the limit 64.
    first = result.steps[10].deployments[0]
    assert first.queue == 64 and first.refused == pytest.approx(240 - 64)
    assert first.wait_p99_seconds == pytest.approx(0.99 * 64 / 8)
    assert first.over_threshold > 0
    # From minute 11 the queue stays full until the new replicas are ready: 64 / 8 = 8 s each
    # minute; the earliest of those is the worst moment.
    worst = [moment for moment in result.worst if moment.kind == "wait"]
    assert (worst[0].step, worst[0].value) == (11, 8.0)
    assert worst[0].words.startswith("chat p99 queue wait 8.0 s at 2026-12-02 08:11")


def test_the_worst_moment_for_notices_carries_the_arbiters_plan_and_its_reasons():
    result = run()
    worst = [moment for moment in result.worst if moment.kind == "notices"]
    assert [moment.step for moment in worst] == [11]
    reasons = [p.reason for p in worst[0].made.plan.preemptions]
    assert all(reason.startswith("reclaimed for sim-chat-") for reason in reasons)


def test_input_the_set_does_not_have_is_refused_with_every_problem():
    profile = Profile(deployments={**chat_load((0, 1)).deployments, "nope": None})
    with pytest.raises(SimulationError) as refused:
        run(
            start=replace(full_set(), now=None),
            profile=profile,
            deployments={"chat": replace(CHAT, pool="gone", gpus_per_replica=3)},
            step_seconds=0,
        )
    assert refused.value.problems == [
        "start: now is required: it is when the simulation starts",
        "deployments.chat.pool: 'gone' is no pool of the set",
        "deployments.chat.gpus_per_replica: 3 GPUs is not an NVLink partition size: NVSwitch "
        "sets allocate whole partitions of 1, 2, 4 or 8 GPUs",
        "profile.deployments.nope: no such deployment in the set",
        "step_seconds: must be 1 or more",
    ]


def test_protected_spot_vms_are_reclaimed_the_minute_enough_of_their_windows_end():
    # An hour's protection: spot-1 is protected until minute 20, spot-2 until 30, spot-3 until
    # 40, spot-4 until 50. The two replicas asked for at minute 3 need two partitions: at 20
    # only spot-1 may go, so they wait; at 30 spot-1 and spot-2 get their notices.
    result = run(start=full_set(protect_seconds=3600), profile=chat_load((0, 4), (2, 12)))
    notices = [(e.vm, e.at) for e in result.events if e.kind == "notice"]
    assert notices == [("spot-2", minute(30)), ("spot-1", minute(30))]
    assert [made.step for made in result.plans] == [3, 20, 30, 35]


def test_vm_arrivals_become_demands_at_their_rate_and_end_after_their_duration():
    arrivals = VmArrivals(Curve(((0.0, 30.0),)), gpus_per_vm=4, duration_seconds=600)
    profile = Profile(deployments=chat_load((0, 4)).deployments, pools={"rent": arrivals})
    result = run(profile=profile, duration_seconds=1800, notice_seconds=60)
    # 30 an hour: half a VM a minute, so one every two minutes from minute 1 (the half of
    # minute 0 carries over). Each reclaims a spot VM (rent ranks above spot), most recent
    # first, and waits for its notice (60 s here) before it starts.
    notices = [(e.vm, e.at) for e in result.events if e.kind == "notice"]
    assert notices == [
        ("spot-4", minute(1)),
        ("spot-3", minute(3)),
        ("spot-2", minute(5)),
        ("spot-1", minute(7)),
    ]
    ends = [(e.vm, e.at) for e in result.events if e.kind == "end"][:2]
    assert ends == [("sim-rent-vm-1", minute(12)), ("sim-rent-vm-2", minute(14))]


def test_a_spot_job_is_reclaimed_whole_and_resumes_whole_as_one_job_again():
    job = {"spot-3": "job-7", "spot-4": "job-7"}
    start = full_set()
    start = replace(start, vms=tuple(replace(vm, group=job.get(vm.id)) for vm in start.vms))
    # Two replicas more at minute 11, one at minute 91 (8 requests/s want two replicas).
    result = run(start=start, profile=chat_load((0, 4), (10, 12), (60, 4), (90, 8)))
    assert notices_at(result, 11) == ["spot-3", "spot-4"]
    resumes = [(e.vm, e.at) for e in result.events if e.kind == "resume"]
    assert resumes == [("spot-3", minute(71)), ("spot-4", minute(71))]
    waiting = next(made.snapshot for made in result.plans if made.step == 71)
    assert {d.id: d.group for d in waiting.demands} == {"spot-3": "job-7", "spot-4": "job-7"}
    # Running again as one job: reclaiming either would take both (8 GPUs), so the one replica
    # asked for at minute 91 takes spot-2 alone, though the job's VMs started later.
    assert notices_at(result, 91) == ["spot-2"]


def test_a_bad_stretch_is_one_worst_moment_and_separate_stretches_are_several():
    """Twenty minutes of long waits are one moment (their worst minute), not the top five
    minutes of one stretch; a second stretch later in the day is its own moment."""
    worst = WorstMoments(count=5)
    at = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    waits = {step: 2.0 + (step == 14) for step in range(10, 30)}  # 08:10-08:29, worst 08:14
    waits |= dict.fromkeys(range(600, 603), 1.5)  # 18:00-18:02
    for step, wait in sorted(waits.items()):
        worst.offer(
            "wait", step=step, at=at + timedelta(minutes=step), value=wait, words="", made=None
        )

    moments = worst.moments()

    assert [(m.step, m.value) for m in moments] == [(14, 3.0), (600, 1.5)]


@pytest.mark.parametrize("protect_seconds", [0, 3600])
def test_each_step_plans_as_the_arbiter_would_afresh_though_steps_share_a_memo(protect_seconds):
    """The run carries the arbiter's memo (gpucap.arbiter.planner.PlanMemo) from step to step;
    every plan it made is the plan of that step's snapshot made from nothing."""
    job = {"spot-3": "job-7", "spot-4": "job-7"}
    start = full_set(protect_seconds=protect_seconds)
    start = replace(start, vms=tuple(replace(vm, group=job.get(vm.id)) for vm in start.vms))
    arrivals = VmArrivals(Curve(((0.0, 20.0),)), gpus_per_vm=4, duration_seconds=1200)
    load = chat_load((0, 4), (10, 12), (60, 4), (90, 8))
    profile = Profile(deployments=load.deployments, pools={"spot": arrivals, "rent": arrivals})
    result = run(start=start, profile=profile, plan_every_step=True, notice_seconds=60)
    assert len(result.plans) == result.plans_made > 100
    assert sum(len(made.plan.preemptions) for made in result.plans) > 0
    for made in result.plans:
        assert plan(made.snapshot) == made.plan, f"step {made.step}"
