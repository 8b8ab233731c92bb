"""A load profile recorded from what really happened (gpucap/inference/load_profile.py): the
deployments' kept minutes and the spot and on-demand pools' rentals of h100-east, laid out
as the days were or folded into one day, in the form the simulator reads.

``NOW`` is Wednesday 2 December 2026, 09:07 UTC; every minute is made by hand."""

from datetime import UTC, datetime, timedelta

import pytest

from gpucap.inference import load_profile
from gpucap.inference import services as inference
from gpucap.inference.load_profile import recorded_profile
from gpucap.inference.models import LoadMinute
from gpucap.rentals.models import VirtualMachine
from gpucap.simulation import profile_from_dict

NOW = datetime(2026, 12, 2, 9, 7, tzinfo=UTC)
DAY1, DAY2 = datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 2, tzinfo=UTC)


@pytest.fixture
def deployments(fleet_east, inference_pools, tenant, member) -> dict:
    """acme's chat and code in h100-inference (set h100-east), and vision elsewhere."""

    def make(name: str, where: str = "set"):
        return inference.deployment_create(
            tenant=tenant,
            pool=inference_pools[where],
            name=name,
            model_name="gpucap/sim-8b",
            gpus_per_replica=1,
            actor=member,
        )

    return {name: make(name) for name in ("chat", "code")} | {
        "vision": make("vision", "standalone")
    }


def minutes(deployment, start: datetime, count: int, requests: int, **fields) -> None:
    LoadMinute.objects.bulk_create(
        LoadMinute(
            deployment=deployment,
            minute=start + timedelta(minutes=n),
            requests=requests,
            **fields,
        )
        for n in range(count)
    )


def rental(pool, tenant, *, created: datetime, gpus: int = 4, ran: timedelta | None = None):
    vm = VirtualMachine.objects.create(
        tenant=tenant,
        pool=pool,
        name=f"vm-{created:%d%H%M}",
        gpu_count=gpus,
        image="ubuntu-24.04-cuda-12.6",
        ssh_public_key="ssh-ed25519 AAAA test",
        state=VirtualMachine.State.TERMINATED if ran else VirtualMachine.State.PENDING,
        started_at=created if ran else None,
        stopped_at=created + ran if ran else None,
        requested_at=created,
    )
    VirtualMachine.objects.filter(pk=vm.pk).update(created_at=created, requested_at=created)
    return vm


@pytest.mark.django_db
def test_the_day_fold_is_the_mean_over_the_days_per_ten_minutes_starting_at_now(
    fleet_east, deployments
):
    chat = deployments["chat"]
    at_8 = timedelta(hours=8)
    minutes(chat, DAY1 + at_8, 10, 60)  # 08:00-08:09 on the 1st: 1 request/s
    minutes(chat, DAY2 + at_8, 10, 300)  # and on the 2nd: 5/s -> the mean, 3/s
    at_9 = timedelta(hours=9)
    minutes(chat, DAY1 + at_9, 9, 120)  # 09:00-09:08 on the 1st: 2/s
    minutes(chat, DAY1 + at_9 + timedelta(minutes=9), 1, 60, seconds=30)  # seen in part: 2/s
    minutes(chat, DAY2 + at_9 + timedelta(minutes=7), 1, 999)  # 09:07 on the 2nd: not yet

    profile = recorded_profile(fleet_east["sets"]["h100-east"], days=2, now=NOW, fold="day")

    # Time 0 is 09:07, inside the 09:00 bucket; 08:00 comes back 22 h 53 min later.
    assert profile["deployments"]["acme-chat"]["points"] == [[0.0, 2.0], [82380.0, 3.0]]
    assert profile["deployments"]["acme-chat"]["shape"] == "step"
    assert "acme-vision" not in profile["deployments"]  # not in the set


@pytest.mark.django_db
def test_a_replay_starts_at_now_minus_the_days_a_point_a_minute(fleet_east, deployments):
    chat = deployments["chat"]
    start = NOW - timedelta(days=1)  # 1 December, 09:07
    minutes(chat, start - timedelta(minutes=1), 1, 6000)  # 09:06: before the window
    minutes(chat, start + timedelta(minutes=3), 1, 60)  # 09:10: 1/s
    minutes(chat, start + timedelta(minutes=4), 1, 120)  # 09:11: 2/s
    minutes(chat, start + timedelta(minutes=6), 1, 120)  # 09:13 (09:12 missed): 2/s

    profile = recorded_profile(fleet_east["sets"]["h100-east"], days=1, now=NOW, fold="replay")

    assert profile["deployments"]["acme-chat"]["points"] == [[180.0, 1.0], [240.0, 2.0]]
    assert any("acme-chat: 1437 of 1440 minutes were not recorded" in n for n in profile["notes"])


@pytest.mark.django_db
def test_service_time_is_littles_law_over_the_sampled_minutes(fleet_east, deployments):
    chat, code = deployments["chat"], deployments["code"]
    minutes(chat, NOW - timedelta(hours=1), 1, 120, in_flight_sampled=3)  # 2/s, 3 in flight
    minutes(chat, NOW - timedelta(minutes=30), 1, 240, in_flight_sampled=9)  # 4/s, 9 in flight
    minutes(chat, NOW - timedelta(minutes=20), 1, 6000)  # no sample: not part of it
    minutes(code, NOW - timedelta(hours=1), 1, 60)  # traffic but never sampled

    profile = recorded_profile(fleet_east["sets"]["h100-east"], days=1, now=NOW, fold="day")

    assert profile["deployments"]["acme-chat"]["service_seconds"] == 2.0  # (3 + 9) / (2 + 4)
    code_load = profile["deployments"]["acme-code"]
    assert code_load["service_seconds"] == load_profile.DEFAULT_SERVICE_SECONDS
    assert any(note.startswith("acme-code: no minute with traffic") for note in profile["notes"])


@pytest.mark.django_db
def test_deployments_without_history_are_left_out_and_named(fleet_east, deployments):
    minutes(deployments["chat"], NOW - timedelta(hours=1), 1, 60)
    minutes(deployments["code"], NOW - timedelta(days=3), 1, 60)  # older than the window

    profile = recorded_profile(fleet_east["sets"]["h100-east"], days=2, now=NOW, fold="day")

    assert list(profile["deployments"]) == ["acme-chat"]
    assert "Left out, with no recorded load in the window: acme-code." in profile["notes"]
    assert profile["pools"] == {}  # no VM was asked for: no arrival curve


@pytest.mark.django_db
def test_pools_get_vm_requests_per_hour_from_their_rentals(
    fleet_east, deployments, tenant, django_assert_num_queries
):
    spot = fleet_east["pools"]["h100-spot"]
    hour = timedelta(hours=1)
    rental(spot, tenant, created=DAY1 + 10 * hour, ran=2 * hour)
    rental(spot, tenant, created=DAY1 + 10 * hour + timedelta(minutes=5), ran=4 * hour)
    rental(spot, tenant, created=DAY2 + 10 * hour - timedelta(days=1, minutes=1), gpus=8)
    rental(spot, tenant, created=DAY2 + 3 * hour, ran=3 * hour, gpus=8)
    rental(spot, tenant, created=DAY2 + 3 * hour + timedelta(minutes=1))
    minutes(deployments["chat"], NOW - hour, 1, 60)

    with django_assert_num_queries(3):  # deployments, their minutes, the pools' VMs
        profile = recorded_profile(fleet_east["sets"]["h100-east"], days=2, now=NOW, fold="day")
    replay = recorded_profile(fleet_east["sets"]["h100-east"], days=2, now=NOW, fold="replay")

    pool = profile["pools"]["h100-spot"]
    assert pool["gpus_per_vm"] == 4  # three of five asked for 4 GPUs
    assert pool["duration_seconds"] == 3 * 3600  # the median of 2, 3 and 4 hours
    assert pool["tenant"] == tenant.slug
    # Per hour of the day over the 2 days, from 09:07: the 09:00 hour had one (09:59 on the
    # 1st) -> 0.5/h; 10:00 two -> 1/h, 53 min on; 03:00 two -> 1/h, 17 h 53 min on.
    assert pool["points"] == [
        [0.0, 0.5],
        [1 * 3600 - 420.0, 1.0],
        [2 * 3600 - 420.0, 0.0],
        [18 * 3600 - 420.0, 1.0],
        [19 * 3600 - 420.0, 0.0],
    ]
    # As it was: time 0 is 30 Nov 09:07, hour n covers [09:07 + n h, 10:07 + n h): 1 Dec
    # 09:59, 10:00 and 10:05 fall in hour 24, 2 Dec 03:00 and 03:01 in hour 41.
    assert replay["pools"]["h100-spot"]["points"] == [
        [0.0, 0.0],
        [24 * 3600.0, 3.0],
        [25 * 3600.0, 0.0],
        [41 * 3600.0, 2.0],
        [42 * 3600.0, 0.0],
    ]
    assert "h100-ondemand" not in profile["pools"]


@pytest.mark.django_db
def test_a_recorded_profile_is_read_by_the_simulators_reader(fleet_east, deployments, tenant):
    minutes(deployments["chat"], NOW - timedelta(hours=2), 90, 120, in_flight_sampled=2)
    rental(fleet_east["pools"]["h100-spot"], tenant, created=NOW - timedelta(hours=5))

    for fold in load_profile.FOLDS:
        data = recorded_profile(fleet_east["sets"]["h100-east"], days=1, now=NOW, fold=fold)
        profile = profile_from_dict(data)
        assert profile.deployments["acme-chat"].requests.at(0) >= 0
        assert profile.deployments["acme-chat"].service_seconds == 1.0  # 2 in flight at 2/s
        assert profile.pools["h100-spot"].duration_seconds == load_profile.DEFAULT_DURATION_SECONDS
        assert data["notes"]
