"""A simulation run whose worker was lost (issue 21): it stays ``running`` with a heartbeat that
no longer moves, and once that is older than ``SIMULATION_STALE_SECONDS`` the next claim takes it
over; after ``SIMULATION_MAX_ATTEMPTS`` claims it is failed. A loss is simulated here by an
exception no ``except Exception`` sees; tests/plans/test_simulation_api.py kills a real worker.
The set is tests/plans/test_simulation_runs.py's."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpucap.plans import simulation_runs
from gpucap.plans.models import SimulationRun
from gpucap.plans.simulation_runs import Outcome, simulation_carry_out
from tests.plans import test_simulation_runs as runs_tests

full_set = runs_tests.full_set
chat = runs_tests.chat
inference_pools = runs_tests.inference_pools
inference_redis = runs_tests.inference_redis
h100 = runs_tests.h100
sent = runs_tests.sent
ask = runs_tests.ask


class WorkerKilled(BaseException):
    """Stands for SIGKILL: no ``except Exception`` sees it, nothing is cleaned up."""


@pytest.mark.django_db
def test_a_run_whose_worker_was_lost_is_taken_over_once_its_heartbeat_is_stale(
    h100, sent, django_capture_on_commit_callbacks, monkeypatch, settings
):
    run = ask(h100, django_capture_on_commit_callbacks)
    simulate = simulation_runs.simulate_start

    def dies_halfway(*args, on_step, **kwargs):
        def step(done, total):
            on_step(done, total)
            if done == 60:
                raise WorkerKilled

        return simulate(*args, on_step=step, **kwargs)

    monkeypatch.setattr(simulation_runs, "simulate_start", dies_halfway)
    with pytest.raises(WorkerKilled):
        simulation_carry_out(run_id=run.pk)
    monkeypatch.setattr(simulation_runs, "simulate_start", simulate)
    lost = SimulationRun.objects.get(pk=run.pk)
    assert lost.state == SimulationRun.State.RUNNING and 0 < lost.steps_done < 120

    # The message delivered again at once: the claim still looks alive, nothing is done.
    assert simulation_carry_out(run_id=run.pk) == Outcome.BUSY
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert simulation_runs.simulations_recover() == 0

    # Once its heartbeat is older than SIMULATION_STALE_SECONDS, the recovery sends it again and
    # the next claim carries it out.
    stale = timezone.now() - timedelta(seconds=settings.SIMULATION_STALE_SECONDS + 1)
    SimulationRun.objects.filter(pk=run.pk).update(heartbeat_at=stale)
    with django_capture_on_commit_callbacks(execute=True):
        assert simulation_runs.simulations_recover() == 1
    assert sent == [("plans.simulate", [run.pk])]
    assert simulation_carry_out(run_id=run.pk) == Outcome.DONE
    done = SimulationRun.objects.get(pk=run.pk)
    assert (done.state, done.attempts, done.steps_done) == ("done", 2, 120)


@pytest.mark.django_db
def test_a_run_that_lost_its_worker_every_time_is_failed(
    h100, sent, django_capture_on_commit_callbacks, settings
):
    run = ask(h100, django_capture_on_commit_callbacks)
    stale = timezone.now() - timedelta(seconds=settings.SIMULATION_STALE_SECONDS + 1)
    SimulationRun.objects.filter(pk=run.pk).update(
        state="running",
        started_at=stale,
        heartbeat_at=stale,
        attempts=settings.SIMULATION_MAX_ATTEMPTS,
    )

    assert simulation_carry_out(run_id=run.pk) == Outcome.BUSY

    run.refresh_from_db()
    assert run.state == SimulationRun.State.FAILED
    assert "lost" in run.error
