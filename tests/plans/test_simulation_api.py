"""The simulation runs' API (issue 21): POST /api/capacity-sets/{id}/simulate/ answers 202 with
the queued run, a worker carries it out, the set's list and the run's detail show progress,
figures and the comparison. Operators only. The set is tests/plans/test_simulation_runs.py's."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpucap.plans import simulation_runs
from gpucap.plans.models import SimulationRun
from gpucap.plans.simulation_runs import simulation_carry_out
from tests.plans import simulation_set
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.conftest import wait_for

full_set = simulation_set.full_set
chat = simulation_set.chat
inference_pools = simulation_set.inference_pools
inference_redis = simulation_set.inference_redis
celery_queue = rentals_fixtures.celery_queue
workers = rentals_fixtures.workers

LOAD = simulation_set.LOAD
NO_CHAT = simulation_set.NO_CHAT
h100 = simulation_set.h100
sent = simulation_set.sent


def simulate(api, h100, capture, **body):
    body = {"profile": LOAD, "hours": 2, **body}
    with capture(execute=True):
        return api.post(f"/api/capacity-sets/{h100.pk}/simulate/", body, format="json")


@pytest.mark.django_db
def test_an_operator_asks_for_a_run_and_gets_202_with_it_queued(
    operator_api, h100, sent, django_capture_on_commit_callbacks
):
    response = simulate(
        operator_api, h100, django_capture_on_commit_callbacks, name="chat at 6/s", changes=NO_CHAT
    )

    assert response.status_code == 202, response.content
    body = response.json()
    assert body["state"] == "queued" and body["name"] == "chat at 6/s"
    assert (body["steps_done"], body["steps_total"], body["progress"]) == (0, 240, 0.0)
    assert body["compares"] is True and body["requested_by"] == "olivia"
    assert body["result"] is None and body["figures"] is None
    assert sent == [("plans.simulate", [body["id"]])]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"profile": {"deployments": {"nope": {"points": [[0, 1]], "service_seconds": 1}}}},
            "profile.deployments.nope",
        ),
        ({"hours": 0}, "hours"),
        ({"step_seconds": 7}, "step_seconds"),
        ({"wait_threshold_seconds": 0}, "wait_threshold_seconds"),
        (
            {"changes": {"pools": {"h100-spot": {"floor_gpus": -1}}}},
            "changes.pools.h100-spot.floor_gpus",
        ),
        ({"changes": {"pools": {"nope": {"rank": 5}}}}, "changes.pools.nope"),
        ({"from_run": 999999}, "from_run"),
        ({"colour": "blue"}, "colour"),
    ],
)
@pytest.mark.django_db
def test_a_bad_request_is_a_400_naming_the_field_and_nothing_is_stored(
    operator_api, h100, sent, django_capture_on_commit_callbacks, body, field
):
    response = simulate(operator_api, h100, django_capture_on_commit_callbacks, **body)

    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    assert not SimulationRun.objects.exists()
    assert sent == []


@pytest.mark.django_db
def test_the_list_shows_runs_newest_first_with_progress_and_figures_without_bodies(
    operator_api, h100, sent, django_capture_on_commit_callbacks, django_assert_num_queries
):
    first = simulate(operator_api, h100, django_capture_on_commit_callbacks).json()
    second = simulate(
        operator_api, h100, django_capture_on_commit_callbacks, changes=NO_CHAT
    ).json()
    simulation_carry_out(run_id=first["id"])

    with django_assert_num_queries(3):  # the set, the count, the page (whatever its size)
        response = operator_api.get(f"/api/capacity-sets/{h100.pk}/simulations/")

    assert response.status_code == 200
    results = response.json()["results"]
    assert [run["id"] for run in results] == [second["id"], first["id"]]
    assert "result" not in results[0] and "variant_result" not in results[0]
    assert results[0]["state"] == "queued" and results[0]["figures"] is None
    done = results[1]
    assert (done["state"], done["progress"]) == ("done", 1.0)
    figures = {figure["label"]: figure["shown"] for figure in done["figures"]}
    assert figures["h100-spot notices/day"] == "24"


@pytest.mark.django_db
def test_the_detail_has_both_results_and_the_differences(
    operator_api, h100, sent, django_capture_on_commit_callbacks
):
    run = simulate(operator_api, h100, django_capture_on_commit_callbacks, changes=NO_CHAT).json()
    simulation_carry_out(run_id=run["id"])

    body = operator_api.get(f"/api/simulations/{run['id']}/").json()

    assert body["state"] == "done" and body["progress"] == 1.0
    assert body["result"]["steps"]["at"] and body["variant_result"]["steps"]["at"]
    assert "h100-spot notices/day 24 → 0" in [d["text"] for d in body["differences"]]
    assert body["changes"] == NO_CHAT
    assert operator_api.get("/api/simulations/999999/").status_code == 404


@pytest.mark.django_db
def test_tenants_are_refused_and_nothing_is_stored(
    member_api, anonymous_api, h100, sent, django_capture_on_commit_callbacks
):
    for api, status in ((member_api, 403), (anonymous_api, 401)):
        assert simulate(api, h100, django_capture_on_commit_callbacks).status_code == status
        assert api.get(f"/api/capacity-sets/{h100.pk}/simulations/").status_code == status
    assert not SimulationRun.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_carries_out_a_posted_run(operator_api, h100, workers):
    worker = workers()

    response = operator_api.post(
        f"/api/capacity-sets/{h100.pk}/simulate/",
        {"profile": LOAD, "hours": 2, "changes": NO_CHAT},
        format="json",
    )

    assert response.status_code == 202, response.content
    run_id = response.json()["id"]
    wait_for(
        lambda: SimulationRun.objects.filter(pk=run_id, state__in=["done", "failed"]).exists(),
        timeout=60,
        what="the worker to carry out the run",
        log=worker.log,
    )
    body = operator_api.get(f"/api/simulations/{run_id}/").json()
    assert body["state"] == "done", body["error"]
    assert body["progress"] == 1.0
    assert "h100-spot notices/day 24 → 0" in [d["text"] for d in body["differences"]]


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_worker_is_killed_is_finished_by_another(operator_api, h100, workers, settings):
    settings.SIMULATION_STALE_SECONDS = 1  # the recovery, here; the workers are told below
    first = workers(SIMULATION_STALE_SECONDS="1")
    response = operator_api.post(
        f"/api/capacity-sets/{h100.pk}/simulate/",
        {"profile": LOAD, "hours": 168, "changes": NO_CHAT},
        format="json",
    )
    run_id = response.json()["id"]
    total = response.json()["steps_total"]

    wait_for(
        lambda: SimulationRun.objects.filter(pk=run_id, steps_done__gt=0).exists(),
        timeout=60,
        what="the first worker to show progress",
        log=first.log,
    )
    first.kill()
    lost = SimulationRun.objects.get(pk=run_id)
    assert lost.state == "running" and lost.steps_done < total

    second = workers(SIMULATION_STALE_SECONDS="1")
    wait_for(
        lambda: SimulationRun.objects.filter(
            pk=run_id, heartbeat_at__lt=timezone.now() - timedelta(seconds=1)
        ).exists(),
        timeout=10,
        what="the lost claim to go stale",
    )
    assert simulation_runs.simulations_recover() == 1
    wait_for(
        lambda: SimulationRun.objects.filter(pk=run_id, state__in=["done", "failed"]).exists(),
        timeout=120,
        what="the second worker to finish the run",
        log=second.log,
    )
    done = SimulationRun.objects.get(pk=run_id)
    assert (done.state, done.attempts, done.steps_done) == ("done", 2, total), done.error
    assert "h100-spot notices/day" in {d["label"] for d in done.differences}
