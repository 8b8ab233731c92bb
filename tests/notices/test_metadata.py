"""The instance metadata endpoint as deployed: gpucap.asgi's application under uvicorn on a
loopback port, talked to over HTTP. Every loopback address is local on Linux, so a client
bound to 127.0.0.2 is a second guest: VM A lives at 127.0.0.1, VM B at 127.0.0.2."""

import json
import os
import socket
import threading
import time
from email.utils import parsedate_to_datetime

import pytest
import urllib3
import uvicorn
from botocore.utils import IMDSFetcher, _RetriesExceededError
from django.db import connection

from gpucap.notices import cache, metadata
from gpucap.notices.cache import utc_z
from gpucap.notices.metadata import event_id, token_mint
from gpucap.notices.models import InterruptionNotice
from gpucap.notices.services import notice_issue
from gpucap.rentals import services
from gpucap.rentals.models import Allocation, VirtualMachine
from tests.conftest import TEST_METADATA_REDIS_URL
from tests.redis_server import free_port

State = VirtualMachine.State
A, B = "127.0.0.1", "127.0.0.2"
GOOGLE = {"Metadata-Flavor": "Google"}
AZURE = {"Metadata": "true"}


# --- the server and its guests -------------------------------------------------------------------


@pytest.fixture
def server(transactional_db, settings, monkeypatch, metadata_test_redis, sent_tasks):
    """gpucap.asgi.application under uvicorn in a thread, on the test database and the test
    metadata Redis; the options are the Procfile's."""
    settings.METADATA_REDIS_URL = TEST_METADATA_REDIS_URL  # where metadata_test_redis writes
    settings.METADATA_TRUSTED_PROXIES = []
    # Keys of this pytest process only: parallel runs use the same addresses in the same Redis.
    prefix = f"gpucap:imds:test{os.getpid()}:ip:"
    monkeypatch.setattr(cache, "KEY_PREFIX", prefix)
    monkeypatch.setattr(cache, "SYNCED_KEY", f"gpucap:imds:test{os.getpid()}:synced")
    monkeypatch.setattr(cache, "RESYNC_CLAIM_KEY", f"gpucap:imds:test{os.getpid()}:resync-claim")
    for key in metadata_test_redis.scan_iter(match=f"{prefix}*"):
        metadata_test_redis.delete(key)
    # A store that has been synced (empty, as the test database is): absent documents are
    # VMs that do not exist (the tests of faults below use a Redis of their own).
    metadata_test_redis.set(cache.SYNCED_KEY, "0")
    from gpucap.asgi import application

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        application, proxy_headers=False, log_level="warning", lifespan="on", timeout_keep_alive=1
    )
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not instance.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    instance.should_exit = True
    thread.join(timeout=10)
    sock.close()


class Guest:
    """An HTTP client whose requests come from ``address``."""

    def __init__(self, base_url: str, address: str) -> None:
        port = int(base_url.rsplit(":", 1)[1])
        self.pool = urllib3.HTTPConnectionPool(
            "127.0.0.1", port, source_address=(address, 0), retries=False, timeout=30
        )

    def request(self, method: str, path: str, headers=None, body=None) -> urllib3.BaseHTTPResponse:
        return self.pool.request(method, path, headers=headers or {}, body=body)

    def token(self, ttl: int = 21600) -> str:
        response = self.request(
            "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)}
        )
        assert response.status == 200, response.data
        return response.data.decode()

    def ec2(self, path: str, token: str | None) -> urllib3.BaseHTTPResponse:
        headers = {} if token is None else {"X-aws-ec2-metadata-token": token}
        return self.request("GET", f"/latest/meta-data/{path}", headers)


@pytest.fixture
def guest_a(server) -> Guest:
    return Guest(server, A)


@pytest.fixture
def guest_b(server) -> Guest:
    return Guest(server, B)


@pytest.fixture
def vm_at(vm_in):
    """``vm_at("127.0.0.1")``: a running spot VM (one H100 GPU) booted with that address."""
    gpus = iter(range(8))

    def make(address: str) -> VirtualMachine:
        vm = vm_in(State.PROVISIONING, gpus=(next(gpus),))
        return services.vm_mark_running(vm=vm, ip_address=address)

    return make


def notify(vm: VirtualMachine) -> InterruptionNotice:
    return notice_issue(vm=vm, reason=InterruptionNotice.Reason.RECLAIM, seconds=120)


# --- EC2 (IMDSv2), through botocore's own client ------------------------------------------------


def test_botocore_reads_the_spot_instance_action_of_a_notified_vm(server, vm_at):
    vm = vm_at(A)
    notice = notify(vm)
    fetcher = IMDSFetcher(base_url=server, config={"ec2_metadata_v1_disabled": True})

    token = fetcher._fetch_metadata_token()
    action = fetcher._get_request("latest/meta-data/spot/instance-action", None, token)
    termination = fetcher._get_request("latest/meta-data/spot/termination-time", None, token)
    instance_id = fetcher._get_request("latest/meta-data/instance-id", None, token)

    assert token
    assert action.status_code == 200
    assert action.headers["content-type"] == "text/plain"
    assert json.loads(action.text) == {"action": "stop", "time": utc_z(notice.deadline)}
    assert action.text.endswith('Z"}')
    assert termination.text == utc_z(notice.deadline)
    assert instance_id.text == vm.instance_id


def test_botocore_gets_404_for_a_vm_without_a_notice(server, vm_at):
    vm = vm_at(A)
    fetcher = IMDSFetcher(base_url=server, config={"ec2_metadata_v1_disabled": True})
    token = fetcher._fetch_metadata_token()

    # botocore's default retry treats the 404 as "no answer" and gives up, as node
    # termination handlers built on it do.
    with pytest.raises(_RetriesExceededError):
        fetcher._get_request("latest/meta-data/spot/instance-action", None, token)
    raw = fetcher._get_request("latest/meta-data/spot/instance-action", lambda r: False, token)
    time_raw = fetcher._get_request(
        "latest/meta-data/spot/termination-time", lambda r: False, token
    )

    assert raw.status_code == 404
    assert time_raw.status_code == 404
    assert fetcher._get_request("latest/meta-data/instance-id", None, token).text == vm.instance_id


@pytest.mark.parametrize("ttl", [None, "0", "21601", "-5", "abc", ""])
def test_token_ttl_outside_1_to_21600_is_refused(guest_a, vm_at, ttl):
    vm_at(A)
    headers = {} if ttl is None else {"X-aws-ec2-metadata-token-ttl-seconds": ttl}

    response = guest_a.request("PUT", "/latest/api/token", headers)

    assert response.status == 400
    assert b"X-aws-ec2-metadata-token-ttl-seconds must be 1..21600" in response.data


@pytest.mark.parametrize("ttl", [1, 21600])
def test_token_ttl_at_the_bounds_is_granted_and_echoed(guest_a, vm_at, ttl):
    vm_at(A)

    response = guest_a.request(
        "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)}
    )

    assert response.status == 200
    assert response.headers["X-aws-ec2-metadata-token-ttl-seconds"] == str(ttl)
    assert guest_a.ec2("instance-id", response.data.decode()).status == 200


# --- security ------------------------------------------------------------------------------------


def test_a_get_without_a_token_is_401(guest_a, vm_at):
    notify(vm_at(A))

    response = guest_a.ec2("spot/instance-action", None)

    assert response.status == 401
    assert b"action" not in response.data


def test_an_expired_token_is_401(guest_a, vm_at):
    notify(vm_at(A))
    expired = token_mint(address=A, ttl=60, now=time.time() - 120)
    fresh = token_mint(address=A, ttl=60)

    assert guest_a.ec2("spot/instance-action", expired).status == 401
    assert guest_a.ec2("spot/instance-action", fresh).status == 200


def test_a_forged_or_tampered_token_is_401(guest_a, vm_at):
    notify(vm_at(A))
    good = guest_a.token()
    expires, signature = good.split(".")
    later = f"{int(expires) + 86400}.{signature}"

    for token in ("nonsense", f"{expires}.{'A' * len(signature)}", later, ""):
        assert guest_a.ec2("spot/instance-action", token).status == 401, token
    assert guest_a.ec2("spot/instance-action", good).status == 200


def test_a_token_minted_for_another_address_is_401(guest_a, guest_b, vm_at):
    vm_at(A)
    notify(vm_at(B))
    token_of_a = guest_a.token()

    response = guest_b.ec2("spot/instance-action", token_of_a)

    assert response.status == 401
    assert guest_b.ec2("spot/instance-action", guest_b.token()).status == 200


def test_x_forwarded_for_from_an_untrusted_address_is_refused(guest_a, vm_at):
    vm_a = vm_at(A)
    notify(vm_at(B))
    spoof = {"X-Forwarded-For": B}

    token_put = guest_a.request(
        "PUT", "/latest/api/token", {**spoof, "X-aws-ec2-metadata-token-ttl-seconds": "60"}
    )
    token = guest_a.token()
    reads = [
        guest_a.request(
            "GET",
            "/latest/meta-data/spot/instance-action",
            {**spoof, "X-aws-ec2-metadata-token": token},
        ),
        guest_a.request("GET", "/computeMetadata/v1/instance/preempted", {**spoof, **GOOGLE}),
        guest_a.request("GET", "/metadata/scheduledevents", {**spoof, **AZURE}),
        guest_a.request("GET", "/metadata/v1/interruption", spoof),
        guest_a.request("POST", "/metadata/v1/interruption/ack", spoof),
    ]

    assert token_put.status == 403
    assert [r.status for r in reads] == [403] * 5
    assert all(b"trusted proxy" in r.data for r in [token_put, *reads])
    vm_a.refresh_from_db()
    assert vm_a.state == State.RUNNING
    assert VirtualMachine.objects.get(ip_address=B).state == State.NOTIFIED


def test_a_trusted_proxy_speaks_for_the_last_address_it_added(guest_a, vm_at, settings):
    settings.METADATA_TRUSTED_PROXIES = [A]
    vm_at(A)
    vm_b = vm_at(B)
    notify(vm_b)
    # The guest wrote the first address itself; the proxy appended the one it saw.
    forwarded = {"X-Forwarded-For": f"{A}, {B}"}

    token = guest_a.request(
        "PUT", "/latest/api/token", {**forwarded, "X-aws-ec2-metadata-token-ttl-seconds": "60"}
    ).data.decode()
    via_proxy = guest_a.request(
        "GET", "/latest/meta-data/instance-id", {**forwarded, "X-aws-ec2-metadata-token": token}
    )
    direct = guest_a.ec2("instance-id", token)

    assert via_proxy.status == 200
    assert via_proxy.data.decode() == vm_b.instance_id
    assert direct.status == 401  # the token belongs to B's address, not the proxy's


def test_vm_a_cannot_read_or_acknowledge_vm_b_notice(guest_a, guest_b, vm_at):
    vm_a = vm_at(A)
    vm_b = vm_at(B)
    notice_b = notify(vm_b)
    token_a = guest_a.token()

    seen_by_a = {
        "instance-id": guest_a.ec2("instance-id", token_a).data.decode(),
        "instance-action": guest_a.ec2("spot/instance-action", token_a).status,
        "gcp": guest_a.request("GET", "/computeMetadata/v1/instance/preempted", GOOGLE).data,
        "azure": json.loads(
            guest_a.request("GET", "/metadata/scheduledevents", headers=AZURE).data
        ),
        "native": guest_a.request("GET", "/metadata/v1/interruption").status,
    }
    azure_ack = guest_a.request(
        "POST",
        "/metadata/scheduledevents",
        AZURE,
        json.dumps(
            {"StartRequests": [{"EventId": event_id(vm_b.instance_id, utc_z(notice_b.issued_at))}]}
        ),
    )
    native_ack = guest_a.request("POST", "/metadata/v1/interruption/ack")

    assert seen_by_a == {
        "instance-id": vm_a.instance_id,
        "instance-action": 404,
        "gcp": b"FALSE",
        "azure": {"DocumentIncarnation": 0, "Events": []},
        "native": 404,
    }
    assert azure_ack.status == 400
    assert native_ack.status == 404
    vm_b.refresh_from_db()
    notice_b.refresh_from_db()
    assert vm_b.state == State.NOTIFIED
    assert notice_b.acknowledged_at is None
    assert guest_b.ec2("spot/instance-action", guest_b.token()).status == 200


def test_an_address_that_is_no_vm_gets_404_everywhere(server):
    stranger = Guest(server, "127.0.0.3")

    responses = [
        stranger.request(
            "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
        ),
        stranger.ec2("instance-id", token_mint(address="127.0.0.3", ttl=60)),
        stranger.request("GET", "/computeMetadata/v1/instance/preempted", GOOGLE),
        stranger.request("GET", "/metadata/scheduledevents", AZURE),
        stranger.request(
            "POST", "/metadata/scheduledevents", AZURE, '{"StartRequests": [{"EventId": "X"}]}'
        ),
        stranger.request("GET", "/metadata/v1/interruption"),
        stranger.request("POST", "/metadata/v1/interruption/ack"),
    ]

    assert [r.status for r in responses] == [404] * 7


def test_the_endpoint_bypasses_django_while_other_paths_reach_it(guest_a, vm_at):
    vm_at(A)

    metadata = guest_a.request("GET", "/metadata/v1/interruption")
    health = guest_a.request("GET", "/healthz")

    assert health.status == 200
    assert health.data == b"ok"
    assert "X-Frame-Options" in health.headers  # Django's middleware ran
    assert metadata.status == 404
    assert "X-Frame-Options" not in metadata.headers
    assert "Set-Cookie" not in metadata.headers


# --- GCP -----------------------------------------------------------------------------------------


def test_gcp_preempted_requires_the_metadata_flavor_header(guest_a, vm_at):
    vm = vm_at(A)

    without = guest_a.request("GET", "/computeMetadata/v1/instance/preempted")
    before = guest_a.request("GET", "/computeMetadata/v1/instance/preempted", GOOGLE)
    notify(vm)
    after = guest_a.request("GET", "/computeMetadata/v1/instance/preempted", GOOGLE)

    assert without.status == 403
    assert b"Metadata-Flavor" in without.data
    assert (before.status, before.data) == (200, b"FALSE")
    assert (after.status, after.data) == (200, b"TRUE")
    assert after.headers["Metadata-Flavor"] == "Google"
    assert after.headers["ETag"] != before.headers["ETag"]


def test_gcp_long_poll_returns_when_a_notice_arrives(guest_a, vm_at):
    vm = vm_at(A)

    def issue_later():
        time.sleep(0.5)
        try:
            notify(vm)
        finally:
            connection.close()

    issuer = threading.Thread(target=issue_later)
    started = time.monotonic()
    issuer.start()
    response = guest_a.request(
        "GET", "/computeMetadata/v1/instance/preempted?wait_for_change=true&timeout_sec=30", GOOGLE
    )
    elapsed = time.monotonic() - started
    issuer.join()

    assert (response.status, response.data) == (200, b"TRUE")
    assert 0.5 <= elapsed < 3, elapsed


def test_gcp_long_poll_is_bounded_and_answers_a_stale_etag_at_once(guest_a, vm_at):
    notify(vm_at(A))
    path = "/computeMetadata/v1/instance/preempted?wait_for_change=true"

    started = time.monotonic()
    unchanged = guest_a.request("GET", f"{path}&timeout_sec=1", GOOGLE)
    waited = time.monotonic() - started
    started = time.monotonic()
    stale = guest_a.request("GET", f"{path}&timeout_sec=30&last_etag=0000", GOOGLE)
    answered = time.monotonic() - started
    too_long = guest_a.request("GET", f"{path}&timeout_sec=61", GOOGLE)

    assert (unchanged.status, unchanged.data) == (200, b"TRUE")
    assert 1 <= waited < 2.5, waited
    assert (stale.status, stale.data) == (200, b"TRUE")
    assert answered < 1, answered
    assert too_long.status == 400
    assert b"timeout_sec must be 1..60" in too_long.data


# --- Azure ---------------------------------------------------------------------------------------


def test_azure_scheduled_events_require_the_metadata_header(guest_a, vm_at):
    vm = vm_at(A)
    notice = notify(vm)

    without = guest_a.request("GET", "/metadata/scheduledevents")
    events = guest_a.request("GET", "/metadata/scheduledevents?api-version=2020-07-01", AZURE)

    assert without.status == 400
    assert b"Required metadata header" in without.data
    assert events.status == 200
    assert events.headers["Content-Type"] == "application/json"
    document = json.loads(events.data)
    (event,) = document["Events"]
    assert document["DocumentIncarnation"] > 0
    assert event == {
        "EventId": event_id(vm.instance_id, utc_z(notice.issued_at)),
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": [vm.instance_id],
        "EventStatus": "Scheduled",
        "NotBefore": event["NotBefore"],
        "Description": "Virtual machine is being preempted (reclaim).",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    assert event["NotBefore"].endswith(" GMT")
    assert parsedate_to_datetime(event["NotBefore"]) == notice.deadline.replace(microsecond=0)


def test_an_unhandled_error_is_a_json_500_with_a_request_id(guest_a, vm_at, monkeypatch, caplog):
    vm_at(A)

    def broken(document):
        raise RuntimeError("the cache is on fire")

    monkeypatch.setattr(metadata, "scheduled_events", broken)

    response = guest_a.request("GET", "/metadata/scheduledevents", AZURE)

    assert response.status == 500
    request_id = response.headers["X-Request-Id"]
    assert json.loads(response.data) == {
        "error": f"the metadata service failed to answer (request id {request_id})"
    }
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged and logged[0].exc_info is not None


def test_an_azure_start_request_nested_50000_deep_is_a_400(guest_a, vm_at):
    vm = vm_at(A)
    notify(vm)
    body = '{"StartRequests": ' + "[" * 50_000 + "]" * 50_000 + "}"

    response = guest_a.request("POST", "/metadata/scheduledevents", AZURE, body)

    assert response.status == 400
    assert b"nested more than 32 levels" in response.data
    vm.refresh_from_db()
    assert vm.state == State.NOTIFIED


def test_azure_start_request_releases_the_gpus_early(guest_a, vm_at, sent_tasks):
    vm = vm_at(A)
    notice = notify(vm)
    events = json.loads(guest_a.request("GET", "/metadata/scheduledevents", AZURE).data)
    event = events["Events"][0]["EventId"]

    no_header = guest_a.request(
        "POST",
        "/metadata/scheduledevents",
        body=json.dumps({"StartRequests": [{"EventId": event}]}),
    )
    wrong_id = guest_a.request(
        "POST",
        "/metadata/scheduledevents",
        AZURE,
        json.dumps({"StartRequests": [{"EventId": "X"}]}),
    )
    malformed = guest_a.request(
        "POST", "/metadata/scheduledevents", AZURE, '{"StartRequests": [{}]}'
    )
    not_json = guest_a.request("POST", "/metadata/scheduledevents", AZURE, "stop please")
    vm.refresh_from_db()
    unchanged = vm.state

    ack = guest_a.request(
        "POST",
        "/metadata/scheduledevents",
        AZURE,
        json.dumps({"StartRequests": [{"EventId": event}]}),
    )
    vm.refresh_from_db()
    notice.refresh_from_db()
    stopping = vm.state
    services.vm_mark_stopped(vm=vm)  # the driver's stop task reports the VM off
    vm.refresh_from_db()
    notice.refresh_from_db()

    assert no_header.status == 400
    assert wrong_id.status == 400
    assert b"no scheduled event 'X'" in wrong_id.data
    assert malformed.status == 400
    assert b"StartRequests[0].EventId: must be a non-empty string" in malformed.data
    assert not_json.status == 400
    assert unchanged == State.NOTIFIED
    assert ack.status == 200
    assert stopping == State.STOPPING
    assert ("rentals.vm_stop", [vm.pk]) in sent_tasks
    assert notice.acknowledged_at is not None
    assert notice.outcome == InterruptionNotice.Outcome.ACKNOWLEDGED
    assert notice.completed_at is not None
    assert notice.completed_at < notice.deadline
    assert vm.state == State.PENDING  # a spot VM resumes when capacity returns
    assert not Allocation.objects.filter(vm=vm, released_at=None).exists()
    assert guest_a.request("GET", "/metadata/scheduledevents", AZURE).status == 404


# --- native --------------------------------------------------------------------------------------


def test_native_interruption_and_acknowledgement(guest_a, vm_at):
    vm = vm_at(A)

    before = guest_a.request("GET", "/metadata/v1/interruption")
    ack_without_notice = guest_a.request("POST", "/metadata/v1/interruption/ack")
    notice = notify(vm)
    during = guest_a.request("GET", "/metadata/v1/interruption")
    ack = guest_a.request("POST", "/metadata/v1/interruption/ack")
    vm.refresh_from_db()

    assert before.status == 404
    assert ack_without_notice.status == 404
    assert during.status == 200
    body = json.loads(during.data)
    assert body == {
        "reason": "reclaim",
        "issued_at": utc_z(notice.issued_at),
        "deadline": utc_z(notice.deadline),
        "seconds_left": body["seconds_left"],
    }
    assert 115 <= body["seconds_left"] <= 120
    assert ack.status == 200
    assert json.loads(ack.data) == {"acknowledged": True, "vm": vm.instance_id}
    assert vm.state == State.STOPPING


# --- the VM's own address and SSH key, as EC2 serves them ------------------------------------


def test_a_guest_reads_its_address_and_its_tenants_ssh_key_as_ec2_serves_them(
    guest_a, guest_b, vm_at
):
    vm_a, vm_b = vm_at(A), vm_at(B)
    VirtualMachine.objects.filter(pk=vm_b.pk).update(ssh_public_key="ssh-ed25519 BBBB other@b")
    cache.metadata_publish(vm_b.pk)
    token = guest_a.token()

    assert guest_a.ec2("local-ipv4", token).data.decode() == A
    assert guest_a.ec2("public-keys/", token).data.decode() == "0=gpucap"
    assert guest_a.ec2("public-keys/0/", token).data.decode() == "openssh-key"
    key = guest_a.ec2("public-keys/0/openssh-key", token)
    assert (key.status, key.data.decode()) == (200, vm_a.ssh_public_key.strip() + "\n")
    # Each guest reads its own: B's key never reaches A, and A's token does not open B's.
    assert guest_b.ec2("public-keys/0/openssh-key", guest_b.token()).data.decode() == (
        "ssh-ed25519 BBBB other@b\n"
    )
    assert guest_b.ec2("public-keys/0/openssh-key", token).status == 401
    assert guest_a.ec2("public-keys/0/openssh-key", None).status == 401


def test_a_document_published_before_addresses_and_keys_answers_404_for_them(guest_a, vm_at):
    vm = vm_at(A)
    client = cache.metadata_redis()
    client.set(cache.metadata_key(A), json.dumps({"vm": vm.instance_id, "notice": None}))
    token = guest_a.token()

    assert guest_a.ec2("instance-id", token).data.decode() == vm.instance_id
    for path in ("local-ipv4", "public-keys/", "public-keys/0/openssh-key"):
        assert guest_a.ec2(path, token).status == 404, path


# --- faults: Redis down, or back without its data ------------------------------------------------


def _every_flavour(guest: Guest, address: str) -> dict[str, urllib3.BaseHTTPResponse]:
    return {
        "ec2 token": guest.request(
            "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
        ),
        "ec2": guest.ec2("spot/instance-action", token_mint(address=address, ttl=60)),
        "gcp": guest.request("GET", "/computeMetadata/v1/instance/preempted", GOOGLE),
        "azure": guest.request("GET", "/metadata/scheduledevents", AZURE),
        "native": guest.request("GET", "/metadata/v1/interruption"),
    }


def test_while_redis_is_down_every_flavour_answers_503_with_retry_after(guest_a, vm_at, settings):
    notify(vm_at(A))
    settings.METADATA_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there

    responses = _every_flavour(guest_a, A)

    assert {name: r.status for name, r in responses.items()} == dict.fromkeys(responses, 503)
    assert {r.headers["Retry-After"] for r in responses.values()} == {"1"}
    assert responses["gcp"].headers["Metadata-Flavor"] == "Google"
    for name in ("azure", "native"):
        assert "cannot reach its store" in json.loads(responses[name].data)["error"]
    assert b"cannot reach its store" in responses["ec2"].data


def test_a_store_back_empty_is_rebuilt_at_once_and_never_answers_no_vm(
    server, vm_at, settings, own_redis
):
    settings.METADATA_REDIS_URL = own_redis.url()
    guest_a, stranger = Guest(server, A), Guest(server, "127.0.0.3")
    notify(vm_at(A))
    cache.metadata_resync()  # the periodic resync has run
    assert guest_a.request("GET", "/metadata/v1/interruption").status == 200

    own_redis.restart_empty()
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        response = guest_a.request("GET", "/metadata/v1/interruption")
        seen.append(response.status)
        if response.status != 503:
            break
        assert response.headers["Retry-After"] == "1"
        time.sleep(0.05)

    # Never "no VM at this address" meanwhile: the store was rebuilt at once, not waited for.
    assert response.status == 200, (seen, response.data)
    assert json.loads(response.data)["reason"] == InterruptionNotice.Reason.RECLAIM
    # Synced again, an address that is no VM is told so.
    assert stranger.request("GET", "/metadata/v1/interruption").status == 404
