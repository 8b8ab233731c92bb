"""The load simulator's pages (issue 21): the set page's Simulations section, the form that
starts a run (a profile uploaded, pasted or recorded; an edited policy to compare), and a run's
page with its progress, then its results or both policies side by side.

The set is tests/plans/test_simulate_command.py's: h100-east full of acme's four 4-GPU spot VMs,
acme's chat deployment (0..2 replicas of 4 GPUs) in h100-inference, rank 1. A load of 6
requests/s asks for two replicas, which the arbiter takes from the two newest spot VMs.
"""

import json
import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from gpucap.plans.models import SimulationRun
from gpucap.plans.simulation_runs import simulation_carry_out
from gpucap.plans.simulation_views import SET_PAGE_RUNS
from tests.plans import simulation_set

full_set = simulation_set.full_set
chat = simulation_set.chat
inference_pools = simulation_set.inference_pools
inference_redis = simulation_set.inference_redis

pytestmark = pytest.mark.django_db

LOAD = simulation_set.LOAD
CHAT_LOAD = LOAD["deployments"]["acme-chat"]


def _url(name: str, **kwargs) -> str:
    return reverse(f"plans:{name}", kwargs={"name": "h100-east", **kwargs})


def _form(**fields) -> dict:
    """The form as the page sends it untouched, with ``fields`` changed."""
    data = {
        "name": "",
        "source": "text",
        "profile_text": json.dumps(LOAD),
        "hours": "2",
        "step_seconds": "60",
        "wait_threshold_seconds": "1",
        "rank__h100-inference": "1",
        "floor__h100-inference": "0",
        "rank__h100-ondemand": "2",
        "floor__h100-ondemand": "0",
        "rank__h100-spot": "3",
        "floor__h100-spot": "0",
        "min__acme-chat": "0",
        "max__acme-chat": "2",
    }
    data.update(fields)
    return {key: value for key, value in data.items() if value is not None}


@pytest.fixture
def form_data(full_set, chat):
    """The page's own form, as sent untouched (read back from the page, so the test follows the
    pools the fixture really made)."""
    from gpucap.fleet.models import Pool

    data = _form()
    for key in [k for k in data if k.startswith(("rank__", "floor__"))]:
        del data[key]
    for pool in Pool.objects.filter(capacity_set__name="h100-east"):
        data[f"rank__{pool.name}"] = str(pool.rank)
        data[f"floor__{pool.name}"] = str(pool.floor_gpus)
    return data


def test_the_form_is_filled_in_with_the_policy_in_force(operator_client, form_data):
    page = operator_client.get(_url("simulations")).content.decode()

    assert 'name="floor__h100-spot"' in page
    assert f'name="rank__h100-spot" value="{form_data["rank__h100-spot"]}"' in page
    assert 'name="max__acme-chat" value="2"' in page


def test_a_pasted_profile_with_an_edited_floor_starts_a_comparison(operator_client, form_data):
    form_data.update({"name": "spot keeps 8", "floor__h100-spot": "8"})

    response = operator_client.post(_url("simulations"), form_data)

    run = SimulationRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == _url("simulation", run_id=run.pk)
    assert run.name == "spot keeps 8"
    assert run.state == SimulationRun.State.QUEUED
    assert run.changes == {"pools": {"h100-spot": {"floor_gpus": 8}}}
    assert run.duration_seconds == 7200


def test_a_form_sent_untouched_compares_nothing(operator_client, form_data):
    operator_client.post(_url("simulations"), form_data)

    assert SimulationRun.objects.get().changes == {}


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"profile_text": "{not json"}, "profile_text", "is not JSON"),
        ({"profile_text": ""}, "profile_text", "paste a profile"),
        ({"profile_text": "[1, 2]"}, "profile_text", "must be a JSON object"),
        (
            {
                "profile_text": json.dumps(
                    {"deployments": {"nope": LOAD["deployments"]["acme-chat"]}}
                )
            },
            "profile_text",
            "nope",
        ),
        (
            {"profile_text": json.dumps({"deployments": {"acme-chat": {"points": [[0, -1]]}}})},
            "profile_text",
            "deployments.acme-chat",
        ),
        ({"floor__h100-spot": "-1"}, "floor__h100-spot", "greater than or equal to 0"),
        ({"hours": "0"}, "hours", "greater than or equal to 1"),
        ({"source": "file"}, "profile_file", "choose a profile file"),
        ({"source": "elsewhere"}, "source", "Select a valid choice"),
    ],
)
def test_bad_input_is_a_400_next_to_its_field_and_stores_nothing(
    operator_client, form_data, fields, field, words
):
    form_data.update(fields)

    response = operator_client.post(_url("simulations"), form_data)

    page = response.content.decode()
    assert response.status_code == 400
    assert f'id="id_{field}-error"' in page
    error = page.split(f'id="id_{field}-error">')[1].split("</p>")[0]
    assert words in error
    assert "Nothing was stored" in page
    assert not SimulationRun.objects.exists()


def test_a_csv_curve_is_one_deployments_load(operator_client, form_data):
    form_data.update({"source": "file", "csv_deployment": "acme-chat", "csv_service_seconds": "1"})
    form_data["profile_file"] = SimpleUploadedFile(
        "chat.csv", b"seconds,rps\n0,2\n3600,6\n", content_type="text/csv"
    )

    operator_client.post(_url("simulations"), form_data)

    profile = SimulationRun.objects.get().profile
    assert profile["deployments"]["acme-chat"]["points"] == [[0, 2], [3600, 6]]
    assert profile["deployments"]["acme-chat"]["service_seconds"] == 1


def test_a_bad_csv_row_is_named(operator_client, form_data):
    form_data.update({"source": "file", "csv_deployment": "acme-chat"})
    form_data["profile_file"] = SimpleUploadedFile("chat.csv", b"0,2\n60,lots\n")

    response = operator_client.post(_url("simulations"), form_data)

    assert response.status_code == 400
    assert "rows[1]: rate must be a number" in response.content.decode()
    assert not SimulationRun.objects.exists()


def test_a_running_run_polls_and_a_finished_one_shows_both_policies(operator_client, form_data):
    # Spot keeps three of its four VMs: chat's two replicas (one group) no longer fit.
    form_data["floor__h100-spot"] = "12"
    operator_client.post(_url("simulations"), form_data)
    run = SimulationRun.objects.get()

    waiting = operator_client.get(_url("simulation", run_id=run.pk)).content.decode()
    assert 'hx-trigger="every 2s"' in waiting
    assert "Queued" in waiting

    simulation_carry_out(run_id=run.pk)
    done = operator_client.get(
        _url("simulation", run_id=run.pk), headers={"HX-Request": "true"}
    ).content.decode()

    assert "every 2s" not in done
    assert "<html" not in done  # the fragment only
    row = re.search(
        r'<tr class="difference-row"[^>]*>\s*<td>h100-spot notices/day</td>(.*?)</tr>', done, re.S
    )
    assert row is not None, "the differences name the spot pool's notices"
    cells = re.findall(r'<td class="num (?:before|after)">(?:<strong>)?([^<]*)', row.group(1))
    assert cells == ["24", "0"]  # two notices in two hours, then none


def test_the_set_page_lists_the_latest_runs(operator_client, form_data):
    operator_client.post(_url("simulations"), {**form_data, "name": "first look"})

    section = operator_client.get(
        _url("simulations-section"), headers={"HX-Request": "true"}
    ).content.decode()
    page = operator_client.get(reverse("fleet:capacity-set-detail", args=["h100-east"]))

    assert "first look" in section
    assert _url("simulations-section") in page.content.decode()


def test_the_section_links_every_run_only_when_it_shows_fewer(operator_client, form_data):
    """Five runs fit the section; a sixth moves the oldest to the set's simulations page."""
    every_run = "Every simulation of h100-east"

    def section() -> str:
        return operator_client.get(
            _url("simulations-section"), headers={"HX-Request": "true"}
        ).content.decode()

    for number in range(1, SET_PAGE_RUNS + 1):
        operator_client.post(_url("simulations"), {**form_data, "name": f"look {number}"})
    shown = section()
    operator_client.post(_url("simulations"), {**form_data, "name": "look 6"})
    after_sixth = section()

    assert every_run not in shown and "look 1" in shown
    assert every_run in after_sixth
    assert "look 6" in after_sixth and "look 1" not in after_sixth


def test_run_again_fills_the_form_in_as_the_run_was_asked(operator_client, form_data):
    form_data.update({"name": "again", "max__acme-chat": "1"})
    operator_client.post(_url("simulations"), form_data)
    run = SimulationRun.objects.get()

    page = operator_client.get(_url("simulations") + f"?again={run.pk}").content.decode()

    assert 'name="max__acme-chat" value="1"' in page
    assert 'name="same_start"' in page
    assert "acme-chat" in page.split('name="profile_text"')[1].split("</textarea>")[0]


def test_tenants_get_403_on_every_simulation_page(member_client, form_data):
    assert member_client.get(_url("simulations")).status_code == 403
    assert member_client.post(_url("simulations"), form_data).status_code == 403
    assert member_client.get(_url("simulations-section")).status_code == 403
    assert member_client.get(_url("simulation", run_id=1)).status_code == 403
    assert not SimulationRun.objects.exists()


def test_a_run_of_another_set_is_not_found_here(operator_client, form_data):
    operator_client.post(_url("simulations"), form_data)
    run = SimulationRun.objects.get()

    other = reverse("plans:simulation", kwargs={"name": "l40s-east", "run_id": run.pk})
    assert operator_client.get(other).status_code == 404
