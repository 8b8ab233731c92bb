"""Lost and expired discoveries (gpucap/bmc/discovery_upkeep.py, the beat's
``bmc.discoveries_recover``): a run whose worker or message was lost shows no progress and is
sent again, then failed once it was sent BMC_DISCOVERY_MAX_ATTEMPTS times, saying so; a worker
shows progress after each BMC and stops reading a run failed meanwhile. A preview not applied
within BMC_DISCOVERY_PREVIEW_TTL_SECONDS expires, its sealed passwords dropped, and applying it
is a 409 saying so — through the API and on the pages."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from gpucap.bmc import discovery_runs
from gpucap.bmc.discovery_runs import Outcome, discovery_carry_out
from gpucap.bmc.discovery_upkeep import discoveries_recover
from gpucap.bmc.models import DiscoveryRun
from gpucap.bmc.redfish import inventory_read
from gpucap.bmc.services import bmc_credential_set
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node

PASSWORD = "s3cret-bmc-password"
HTMX = {"HX-Request": "true"}


@pytest.fixture
def east(db) -> Cluster:
    return fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)


def entry(address: str, **fields) -> dict:
    return {
        "cluster": "east",
        "address": address,
        "username": "admin",
        "password": PASSWORD,
        "fabric": "nvswitch",
        "gpu_model": "H100-SXM5-80GB",
        **fields,
    }


@pytest.fixture
def request_run(django_capture_on_commit_callbacks, sent_tasks):
    def make(*entries: dict) -> DiscoveryRun:
        with django_capture_on_commit_callbacks(execute=True):
            run = discovery_runs.discovery_request(entries=list(entries))
        return run

    return make


def aged(run: DiscoveryRun, seconds: float, **fields) -> DiscoveryRun:
    """The run as if it had last shown progress ``seconds`` ago."""
    DiscoveryRun.objects.filter(pk=run.pk).update(
        progress_at=timezone.now() - timedelta(seconds=seconds), **fields
    )
    return DiscoveryRun.objects.get(pk=run.pk)


def recover(django_capture_on_commit_callbacks, **kwargs):
    with django_capture_on_commit_callbacks(execute=True):
        return discoveries_recover(**kwargs)


def test_a_run_whose_message_was_lost_is_sent_again_and_then_read(
    east, gpu_server_bmc, request_run, sent_tasks, settings, django_capture_on_commit_callbacks
):
    settings.BMC_DISCOVERY_STALE_SECONDS = 300
    lost = request_run(entry(gpu_server_bmc.url))
    busy = request_run(entry(gpu_server_bmc.url, hostname="h100-002"))
    sent_tasks.clear()  # the broker lost both messages
    aged(lost, 301)
    aged(busy, 299)  # still within the time a run may show no progress

    upkeep = recover(django_capture_on_commit_callbacks)

    assert upkeep.sent == [lost.pk] and upkeep.failed == []
    assert sent_tasks == [("bmc.discover", [lost.pk])]
    assert DiscoveryRun.objects.get(pk=lost.pk).sends == 2
    assert discovery_carry_out(run_id=lost.pk) == Outcome.PREVIEWED
    # A second round finds nothing lost.
    sent_tasks.clear()
    assert recover(django_capture_on_commit_callbacks).sent == []


def test_a_run_lost_too_often_fails_saying_so_and_a_late_worker_does_nothing(
    east, gpu_server_bmc, request_run, sent_tasks, settings, django_capture_on_commit_callbacks
):
    settings.BMC_DISCOVERY_MAX_ATTEMPTS = 3
    run = aged(request_run(entry(gpu_server_bmc.url)), 10_000, sends=3)
    sent_tasks.clear()

    upkeep = recover(django_capture_on_commit_callbacks)

    assert upkeep.failed == [run.pk] and upkeep.sent == [] and sent_tasks == []
    run.refresh_from_db()
    assert run.state == "failed" and run.passwords_sealed == [] and run.finished_at
    assert run.problems == [
        "the discovery showed no progress while reading the BMCs: its worker or its message "
        "was lost 3 times; nothing was applied. Discover again"
    ]
    assert discovery_carry_out(run_id=run.pk) == Outcome.NOTHING  # the late worker
    assert DiscoveryRun.objects.get(pk=run.pk).state == "failed"


def test_a_lost_apply_fails_saying_nothing_was_applied(
    east, gpu_server_bmc, request_run, sent_tasks, settings, django_capture_on_commit_callbacks
):
    run = request_run(entry(gpu_server_bmc.url))
    discovery_carry_out(run_id=run.pk)
    with django_capture_on_commit_callbacks(execute=True):
        discovery_runs.discovery_apply_request(run=run)
    aged(run, 10_000, sends=settings.BMC_DISCOVERY_MAX_ATTEMPTS)

    recover(django_capture_on_commit_callbacks)

    run.refresh_from_db()
    assert run.state == "failed"
    assert "while applying the preview: its worker or its message was lost" in run.problems[0]
    assert discovery_carry_out(run_id=run.pk) == Outcome.NOTHING
    assert not Node.objects.exists()


def test_a_worker_shows_progress_after_each_bmc(east, gpu_server_bmc, request_run):
    run = aged(request_run(entry(gpu_server_bmc.url), entry(gpu_server_bmc.url)), 10_000)
    seen = []

    def read(target):
        seen.append(DiscoveryRun.objects.get(pk=run.pk).progress_at)
        return inventory_read(target)

    discovery_carry_out(run_id=run.pk, read=read)

    # Taken (marked before the first BMC), then marked again after the first.
    assert run.progress_at < seen[0] < seen[1]


def test_a_worker_stops_reading_a_run_failed_meanwhile(
    east, gpu_server_bmc, request_run, settings, django_capture_on_commit_callbacks
):
    run = request_run(entry(gpu_server_bmc.url), entry(gpu_server_bmc.url))
    DiscoveryRun.objects.filter(pk=run.pk).update(sends=settings.BMC_DISCOVERY_MAX_ATTEMPTS)
    read = []

    def read_slowly(target):
        # The beat's round runs while this (late) worker reads: to it, the run looks lost.
        later = timezone.now() + timedelta(seconds=settings.BMC_DISCOVERY_STALE_SECONDS + 1)
        recover(django_capture_on_commit_callbacks, now=later)
        read.append(target.address)
        return inventory_read(target)

    assert discovery_carry_out(run_id=run.pk, read=read_slowly) == Outcome.NOTHING
    assert len(read) == 1  # the second BMC is not asked
    run.refresh_from_db()
    assert run.state == "failed" and run.changes == []


# --- previews that expire -----------------------------------------------------------------------


@pytest.fixture
def previewed(east, gpu_server_bmc, request_run, sent_tasks):
    run = request_run(entry(gpu_server_bmc.url))
    assert discovery_carry_out(run_id=run.pk) == Outcome.PREVIEWED
    sent_tasks.clear()
    return DiscoveryRun.objects.get(pk=run.pk)


def read_ago(run: DiscoveryRun, seconds: float) -> None:
    DiscoveryRun.objects.filter(pk=run.pk).update(
        read_at=timezone.now() - timedelta(seconds=seconds)
    )


def test_a_preview_older_than_its_time_expires_and_drops_its_passwords(
    previewed, gpu_server_bmc, request_run, settings, django_capture_on_commit_callbacks
):
    settings.BMC_DISCOVERY_PREVIEW_TTL_SECONDS = 3600
    fresh = request_run(entry(gpu_server_bmc.url))
    discovery_carry_out(run_id=fresh.pk)
    assert previewed.passwords_sealed != []
    read_ago(previewed, 3601)
    read_ago(fresh, 3500)

    assert recover(django_capture_on_commit_callbacks).expired == 1

    previewed.refresh_from_db()
    assert previewed.state == "expired" and previewed.passwords_sealed == []
    assert previewed.finished_at is not None
    assert DiscoveryRun.objects.get(pk=fresh.pk).state == "previewed"


def test_applying_an_expired_preview_is_a_409_saying_so(
    previewed, operator_api, sent_tasks, django_capture_on_commit_callbacks
):
    read_ago(previewed, 3601)
    recover(django_capture_on_commit_callbacks)

    answer = operator_api.post(f"/api/bmc/discoveries/{previewed.pk}/apply/")

    assert answer.status_code == 409
    assert answer.json()["error"] == {
        "code": "expired",
        "message": f"discovery {previewed.pk} was not applied in time: the preview expired; "
        "discover again",
        "fields": {},
    }
    shown = operator_api.get(f"/api/bmc/discoveries/{previewed.pk}/").json()
    assert shown["state"] == "expired" and "the preview expired" in shown["message"]
    assert sent_tasks == [] and not Node.objects.exists()


def test_a_preview_past_its_time_expires_when_it_is_applied_before_the_beat_comes(
    previewed, operator_api, sent_tasks
):
    read_ago(previewed, 3601)

    answer = operator_api.post(f"/api/bmc/discoveries/{previewed.pk}/apply/")

    assert answer.status_code == 409 and answer.json()["error"]["code"] == "expired"
    previewed.refresh_from_db()
    assert previewed.state == "expired" and previewed.passwords_sealed == []
    assert sent_tasks == []


def test_the_cluster_page_says_the_preview_expired(
    previewed, operator_client, django_capture_on_commit_callbacks, sent_tasks
):
    read_ago(previewed, 3601)
    recover(django_capture_on_commit_callbacks)
    url = reverse("fleet:cluster-discovery", args=["east", previewed.pk])

    shown = operator_client.get(url, headers=HTMX).content.decode()
    assert "expired without being applied, and its passwords were dropped" in shown
    assert "Expired: discover again" in shown
    apply = reverse("fleet:cluster-discovery-apply", args=["east", previewed.pk])
    assert apply not in shown
    refused = operator_client.post(apply, headers=HTMX)
    assert refused.status_code == 409
    assert "the preview expired; discover again" in refused.content.decode()


def test_the_node_panel_says_the_preview_expired(
    east, gpu_server_bmc, operator_client, django_capture_on_commit_callbacks, sent_tasks
):
    node = fleet.node_create(
        cluster=east,
        hostname="h100-001",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
        bmc_address=gpu_server_bmc.url,
    )
    bmc_credential_set(node=node, username="admin", password=PASSWORD)
    run = discovery_runs.node_rediscover(node=node)
    discovery_carry_out(run_id=run.pk)
    read_ago(run, 3601)
    recover(django_capture_on_commit_callbacks)

    panel = operator_client.get(
        reverse("fleet:node-bmc", args=["east", "h100-001"]), headers=HTMX
    ).content.decode()

    assert "expired without being applied; nothing was applied. Rediscover" in panel
    assert reverse("fleet:node-bmc-apply", args=["east", "h100-001", run.pk]) not in panel


def test_the_beat_runs_the_round_at_the_period_of_its_setting(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["bmc-discoveries-recover"]

    assert entry["task"] == "bmc.discoveries_recover"
    assert entry["schedule"] == float(settings.BMC_DISCOVERY_RECOVER_SECONDS)
