"""A recorded load profile reachable: ``manage.py load_profile SET --days N`` (whose JSON
``manage.py simulate`` replays) and ``GET /api/capacity-sets/{id}/load-profile/`` (operators
only). acme's chat in h100-inference served 2 requests/s over the last two hours, 2 of them in
flight when sampled, and acme asked for a spot VM three hours ago."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from gpucap.inference import services as inference
from gpucap.inference.models import LoadMinute
from gpucap.rentals.models import VirtualMachine


@pytest.fixture
def recorded(fleet_east, inference_pools, tenant, member):
    chat = inference.deployment_create(
        tenant=tenant,
        pool=inference_pools["set"],
        name="chat",
        model_name="gpucap/sim-8b",
        gpus_per_replica=4,
        min_replicas=0,
        max_replicas=2,
        actor=member,
    )
    now = timezone.now().replace(second=0, microsecond=0)
    LoadMinute.objects.bulk_create(
        LoadMinute(
            deployment=chat,
            minute=now - timedelta(minutes=n),
            requests=120,
            in_flight_sampled=2,
        )
        for n in range(1, 121)
    )
    vm = VirtualMachine.objects.create(
        tenant=tenant,
        pool=fleet_east["pools"]["h100-spot"],
        name="train-1",
        gpu_count=4,
        image="ubuntu-24.04-cuda-12.6",
        ssh_public_key="ssh-ed25519 AAAA test",
        requested_at=now,
    )
    VirtualMachine.objects.filter(pk=vm.pk).update(created_at=now - timedelta(hours=3))
    return fleet_east["sets"]["h100-east"]


def url(capacity_set_id: int, query: str = "days=7&fold=day") -> str:
    return f"/api/capacity-sets/{capacity_set_id}/load-profile/?{query}"


@pytest.mark.django_db
def test_the_command_prints_a_profile_that_simulate_replays(recorded, tmp_path):
    out = StringIO()
    call_command("load_profile", "h100-east", "--days", "1", stdout=out)
    profile = json.loads(out.getvalue())
    assert profile["deployments"]["acme-chat"]["service_seconds"] == 1.0  # 2 in flight at 2/s
    assert profile["deployments"]["acme-chat"]["points"][0][1] in (0.0, 2.0)
    assert profile["pools"]["h100-spot"]["gpus_per_vm"] == 4

    path = tmp_path / "p.json"
    path.write_text(out.getvalue())
    result = StringIO()
    call_command("simulate", "h100-east", str(path), "--hours", "2", "--json", stdout=result)
    simulated = json.loads(result.getvalue())
    assert simulated["steps"]  # a result, from the recorded load


@pytest.mark.django_db
def test_the_command_refuses_an_unknown_set_and_days_beyond_the_history(recorded):
    with pytest.raises(CommandError, match="no capacity set is named 'nowhere'"):
        call_command("load_profile", "nowhere", "--days", "1")
    with pytest.raises(CommandError, match="--days must be 1 to 30"):
        call_command("load_profile", "h100-east", "--days", "31")


@pytest.mark.django_db
def test_operators_get_the_profile(recorded, operator_api):
    response = operator_api.get(url(recorded.pk, "days=1&fold=replay"))

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"deployments", "pools", "notes"}
    # Time 0 is a day ago; the history starts two hours ago (less the seconds of this minute
    # gone), at 2/s until now.
    [(time, rate)] = body["deployments"]["acme-chat"]["points"]
    assert 86400 - 7200 - 60 < time <= 86400 - 7200 and rate == 2.0
    assert body["pools"]["h100-spot"]["points"][-1][1] == 0.0


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query, field",
    [
        ("days=0", "days"),
        ("days=31", "days"),
        ("days=seven", "days"),
        ("fold=day", "days"),
        ("days=7&fold=week", "fold"),
        ("days=7&step=60", "step"),
    ],
)
def test_a_bad_query_is_a_400_naming_the_parameter(recorded, operator_api, query, field):
    response = operator_api.get(url(recorded.pk, query))
    assert response.status_code == 400
    assert set(response.json()["error"]["fields"]) == {field}


@pytest.mark.django_db
def test_the_history_setting_bounds_the_days(recorded, operator_api, settings):
    settings.LOAD_HISTORY_DAYS = 3
    assert operator_api.get(url(recorded.pk, "days=3")).status_code == 200
    response = operator_api.get(url(recorded.pk, "days=4"))
    assert response.status_code == 400
    assert "3 or less" in response.json()["error"]["fields"]["days"][0]


@pytest.mark.django_db
def test_tenants_are_refused_and_an_unknown_set_is_404(recorded, member_api, operator_api):
    assert member_api.get(url(recorded.pk)).status_code == 403
    response = operator_api.get(url(recorded.pk + 1000))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
