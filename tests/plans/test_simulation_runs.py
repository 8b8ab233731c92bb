"""Stored simulation runs (issue 21): asked for with everything checked first, carried out once
by whichever worker claims them, with progress, a comparison with an edited configuration, and
a run whose worker was lost taken over.

The set is tests/plans/test_simulate_command.py's: h100-east full of acme's four 4-GPU spot
VMs; acme's chat deployment (0..2 replicas of 4 GPUs) under a load of 6 requests/s wants two
replicas, which the arbiter takes from the two newest spot VMs: 2 notices in two hours, "24 a
day". With chat held to no replica (the edited configuration) there is no notice at all.
"""

import json
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.plans import simulation_runs
from gpucap.plans.models import SimulationRun
from gpucap.plans.simulation_runs import Outcome, simulation_carry_out, simulation_request
from gpucap.rentals.models import VirtualMachine
from gpucap.schedules import services as schedules
from tests.plans import simulation_set

full_set = simulation_set.full_set
chat = simulation_set.chat
LOAD = simulation_set.LOAD
inference_pools = simulation_set.inference_pools
inference_redis = simulation_set.inference_redis

NO_CHAT = simulation_set.NO_CHAT
h100 = simulation_set.h100
sent = simulation_set.sent


def ask(h100, django_capture_on_commit_callbacks, **options) -> SimulationRun:
    options.setdefault("profile", LOAD)
    options.setdefault("hours", 2)
    with django_capture_on_commit_callbacks(execute=True):
        return simulation_request(h100, **options)


def refused(h100, **options) -> dict[str, list[str]]:
    options.setdefault("profile", LOAD)
    options.setdefault("hours", 2)
    with pytest.raises(ValidationError) as error:
        simulation_request(h100, **options)
    return error.value.message_dict


# --- asking -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_request_is_stored_queued_audited_and_sent_to_a_worker(
    h100, operator, sent, django_capture_on_commit_callbacks
):
    run = ask(h100, django_capture_on_commit_callbacks, name="chat at 6/s", by=operator)

    assert run.state == SimulationRun.State.QUEUED
    assert (run.steps_done, run.steps_total) == (0, 120)
    assert run.requested_by == operator and run.name == "chat at 6/s"
    assert {vm["id"] for vm in run.start["snapshot"]["vms"]} == {
        vm.instance_id for vm in VirtualMachine.objects.all()
    }
    assert "acme-chat" in run.start["deployments"]
    assert sent == [("plans.simulate", [run.pk])]
    event = AuditEvent.objects.get(verb="simulation.request")
    assert event.object_id == str(run.pk) and event.actor == operator


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"profile": "{"}, "profile"),
        ({"profile": [1]}, "profile"),
        (
            {
                "profile": {
                    "deployments": {"acme-chat": {"points": [[0, -1]], "service_seconds": 1}}
                }
            },
            "profile.deployments.acme-chat.points[0]",
        ),
        (
            {"profile": {"deployments": {"nope": {"points": [[0, 1]], "service_seconds": 1}}}},
            "profile.deployments.nope",
        ),
        ({"hours": 0}, "hours"),
        ({"hours": 169}, "hours"),
        ({"hours": True}, "hours"),
        ({"step_seconds": 5}, "step_seconds"),
        ({"step_seconds": 7}, "step_seconds"),  # 7200 s are no whole number of 7 s steps
        ({"wait_threshold_seconds": 0}, "wait_threshold_seconds"),
        ({"wait_threshold_seconds": float("nan")}, "wait_threshold_seconds"),
        ({"name": "x" * 121}, "name"),
        ({"changes": [1]}, "changes"),
        ({"changes": {"colour": 1}}, "changes.colour"),
        ({"changes": {"pools": {"nope": {"rank": 4}}}}, "changes.pools.nope"),
        (
            {"changes": {"pools": {"h100-spot": {"floor_gpus": -1}}}},
            "changes.pools.h100-spot.floor_gpus",
        ),
        ({"changes": {"pools": {"h100-spot": {"size": 1}}}}, "changes.pools.h100-spot.size"),
        ({"changes": {"pools": {"h100-spot": {"rank": 1}}}}, "changes.pools.h100-spot.rank"),
        ({"changes": {"deployments": {"nope": {"max_replicas": 1}}}}, "changes.deployments.nope"),
        (
            {"changes": {"deployments": {"acme-chat": {"min_replicas": 3, "max_replicas": 1}}}},
            "changes.deployments.acme-chat.min_replicas",
        ),
        ({"changes": {"schedule": "none"}}, "changes.schedule"),
        (
            {
                "changes": {
                    "schedule": [
                        {
                            "name": "day",
                            "days": "mon-fri",
                            "start": "25:00",
                            "end": "20:00",
                            "time_zone": "UTC",
                            "pools": {"h100-spot": {"floor_gpus": 8}},
                        }
                    ]
                }
            },
            "changes.schedule[0].start",
        ),
        (
            {
                "changes": {
                    "schedule": [
                        {
                            "name": "day",
                            "days": "mon",
                            "start": "08:00",
                            "end": "20:00",
                            "time_zone": "UTC",
                            "pools": {"nope": {"floor_gpus": 1}},
                        }
                    ]
                }
            },
            "changes.schedule[0].pools.nope",
        ),
    ],
)
@pytest.mark.django_db
def test_every_bad_field_is_refused_by_name_and_nothing_is_written(h100, sent, options, field):
    audited = AuditEvent.objects.count()

    problems = refused(h100, **options)

    assert field in problems, problems
    assert not SimulationRun.objects.exists()
    assert AuditEvent.objects.count() == audited
    assert sent == []


@pytest.mark.django_db
def test_a_run_of_another_set_cannot_be_started_from(
    h100, fleet_east, sent, django_capture_on_commit_callbacks
):
    other = fleet_east["sets"]["l40s-east"]
    run = ask(h100, django_capture_on_commit_callbacks)
    assert "from_run" in refused(other, from_run=run)


# --- carrying out -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_carried_out_run_stores_its_result_and_the_notices_the_dry_run_would_name(
    h100, full_set, sent, django_capture_on_commit_callbacks
):
    run = ask(h100, django_capture_on_commit_callbacks)

    assert simulation_carry_out(run_id=run.pk) == Outcome.DONE

    run.refresh_from_db()
    assert run.state == SimulationRun.State.DONE
    assert (run.steps_done, run.steps_total) == (120, 120)
    assert run.started_at <= run.finished_at
    notices = [e for e in run.result["events"] if e["kind"] == "notice"]
    assert sorted(e["vm"] for e in notices) == sorted(vm.instance_id for vm in full_set[2:])
    figures = {f["label"]: f["shown"] for f in run.result["figures"]}
    assert figures["h100-spot notices/day"] == "24"
    assert run.variant_result is None and run.differences == []
    # Nothing live was touched.
    assert set(VirtualMachine.objects.values_list("state", flat=True)) == {"running"}


@pytest.mark.django_db
def test_a_comparison_says_what_the_edited_configuration_changes(
    h100, sent, django_capture_on_commit_callbacks
):
    run = ask(h100, django_capture_on_commit_callbacks, changes=NO_CHAT)
    assert run.steps_total == 240  # both runs

    simulation_carry_out(run_id=run.pk)

    run.refresh_from_db()
    assert run.steps_done == 240
    texts = [d["text"] for d in run.differences]
    assert "h100-spot notices/day 24 → 0" in texts
    spot = next(d for d in run.differences if d["key"] == "h100-spot.notices_per_day")
    assert (spot["before"], spot["after"]) == ("24", "0")
    assert (spot["before_value"], spot["after_value"]) == (24, 0)
    assert not [e for e in run.variant_result["events"] if e["kind"] == "notice"]


@pytest.mark.django_db
def test_a_changed_floor_keeps_the_spot_vms(h100, sent, django_capture_on_commit_callbacks):
    changes = {"pools": {"h100-spot": {"floor_gpus": 12}}}
    run = ask(h100, django_capture_on_commit_callbacks, changes=changes)

    simulation_carry_out(run_id=run.pk)

    run.refresh_from_db()
    assert "h100-spot notices/day 24 → 0" in [d["text"] for d in run.differences]


@pytest.mark.django_db
def test_progress_moves_while_it_runs(h100, sent, django_capture_on_commit_callbacks, monkeypatch):
    run = ask(h100, django_capture_on_commit_callbacks, changes=NO_CHAT)
    seen = []
    simulate = simulation_runs.simulate_start

    def watched(*args, on_step, **kwargs):
        def step(done, total):
            on_step(done, total)
            seen.append(SimulationRun.objects.get(pk=run.pk).steps_done)

        return simulate(*args, on_step=step, **kwargs)

    monkeypatch.setattr(simulation_runs, "simulate_start", watched)

    simulation_carry_out(run_id=run.pk)

    assert seen == sorted(seen)  # never goes back
    stored = sorted(set(seen) - {0})
    assert 15 <= len(stored) <= 25  # every ~5% of 240 steps
    assert any(120 < value < 240 for value in stored)  # the edited run counts on


@pytest.mark.django_db
def test_two_carry_outs_of_one_run_give_one_result(h100, sent, django_capture_on_commit_callbacks):
    run = ask(h100, django_capture_on_commit_callbacks)

    assert simulation_carry_out(run_id=run.pk) == Outcome.DONE
    first = SimulationRun.objects.get(pk=run.pk)
    assert simulation_carry_out(run_id=run.pk) == Outcome.NOTHING

    again = SimulationRun.objects.get(pk=run.pk)
    assert again.attempts == 1
    assert (again.finished_at, again.result) == (first.finished_at, first.result)


@pytest.mark.django_db
def test_a_run_that_fails_is_stored_failed_with_the_reason(
    h100, sent, django_capture_on_commit_callbacks, monkeypatch
):
    run = ask(h100, django_capture_on_commit_callbacks)

    def broken(*args, **kwargs):
        raise RuntimeError("the arbiter met a bug")

    monkeypatch.setattr(simulation_runs, "simulate_start", broken)

    assert simulation_carry_out(run_id=run.pk) == Outcome.FAILED
    run.refresh_from_db()
    assert run.state == SimulationRun.State.FAILED
    assert "the arbiter met a bug" in run.error
    assert run.finished_at is not None and run.result is None


@pytest.mark.django_db
def test_a_run_from_a_stored_start_reproduces_its_result_after_the_set_changed(
    h100, full_set, sent, django_capture_on_commit_callbacks
):
    first = ask(h100, django_capture_on_commit_callbacks)
    simulation_carry_out(run_id=first.pk)
    first.refresh_from_db()
    # The set changes: the spot pool keeps most of its GPUs now.
    fleet.pool_set_floor(pool=h100.pools.get(name="h100-spot"), floor_gpus=12)

    again = ask(h100, django_capture_on_commit_callbacks, from_run=first)
    now = ask(h100, django_capture_on_commit_callbacks)
    simulation_carry_out(run_id=again.pk)
    simulation_carry_out(run_id=now.pk)

    again.refresh_from_db()
    now.refresh_from_db()
    assert again.start == first.start
    assert again.result == first.result
    assert now.result["figures"] != first.result["figures"]


# --- the command --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_command_stores_a_run_with_store_and_prints_its_id(h100, sent, tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(LOAD))
    out = StringIO()

    call_command("simulate", "h100-east", str(path), "--hours", "2", "--store", stdout=out)

    run = SimulationRun.objects.get()
    assert out.getvalue().startswith(f"simulation run {run.pk} of h100-east: done")
    assert "h100-spot notices/day: 24" in out.getvalue()
    assert sent == []  # carried out here, not sent to a worker


ALL_DAY = {"days": "every day", "start": "00:00", "end": "00:00", "time_zone": "UTC"}


@pytest.mark.django_db
def test_the_set_schedule_is_kept_replaced_or_dropped_by_the_changes(
    h100, sent, django_capture_on_commit_callbacks
):
    # The set's own schedule keeps the spot VMs all day: no notice today.
    schedules.schedule_entry_save(
        capacity_set=h100,
        data={"name": "keep-spot", **ALL_DAY, "pools": {"h100-spot": {"floor_gpus": 12}}},
    )
    dropped = ask(h100, django_capture_on_commit_callbacks, changes={"schedule": []})
    replaced = ask(
        h100,
        django_capture_on_commit_callbacks,
        changes={
            "schedule": [{"name": "let-go", **ALL_DAY, "pools": {"h100-spot": {"floor_gpus": 0}}}]
        },
    )
    for run in (dropped, replaced):
        simulation_carry_out(run_id=run.pk)
        run.refresh_from_db()
        assert [e["name"] for e in run.start["entries"]] == ["keep-spot"]
        assert "h100-spot notices/day 0 → 24" in [d["text"] for d in run.differences]
