"""The readiness probe of inference replicas (gpucap.inference.probe): the router sends a replica
requests only once its model server answers ``GET /v1/models``, keeps probing it, and drops it
after ``INFERENCE_PROBE_FAILURES`` failed probes in a row, until it answers again.

The model servers here are real HTTP servers on ephemeral loopback ports, started by the tests;
the router is gpucap.asgi's application under uvicorn (tests/inference/test_router.py's server),
talked to over HTTP. A probe round is what beat runs: the ``inference.probe`` task."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet
from gpucap.inference import cache, probe
from gpucap.inference.models import ReplicaProbe
from gpucap.inference.tasks import probe_replicas
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.inference import test_router as router_tests
from tests.inference.test_router import chat, wait_until

State = VirtualMachine.State

# The router as deployed and the simulated replicas (tests/inference/test_router.py), with the
# router's documents in that module's Redis database, under this process's key prefix.
inference_redis = router_tests.inference_redis
server = router_tests.server
sim = router_tests.sim
serving = router_tests.serving
key = router_tests.key


# --- a model server of our own -------------------------------------------------------------------


class ModelServer:
    """An OpenAI-style model server on 127.0.0.1: ``GET /v1/models`` answers ``status`` (200 unless
    told otherwise), ``POST /v1/chat/completions`` a canned answer. ``stop()`` closes its port
    (connections are refused), ``start()`` opens the same port again. Every request it saw is
    in ``seen`` as (method, path)."""

    def __init__(self) -> None:
        self.status = 200
        self.seen: list[tuple[str, str]] = []
        self.port = 0
        self._httpd = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                owner.seen.append(("GET", self.path))
                if self.path == "/v1/models":
                    self._answer(owner.status, {"object": "list", "data": [{"id": "m"}]})
                else:
                    self._answer(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.seen.append(("POST", self.path))
                self._answer(
                    200,
                    {
                        "id": "chatcmpl-1",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "gpucap/sim-8b",
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": "hello"},
                                "finish_reason": "stop",
                            }
                        ],
                    },
                )

            def _answer(self, status: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")  # stop() leaves no connection open
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

            def log_message(self, *args) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


@pytest.fixture
def model_server():
    """``model_server()``: a new model server; all are stopped after the test."""
    started = []

    def make() -> ModelServer:
        started.append(ModelServer())
        return started[-1]

    yield make
    for one in started:
        one.stop()


@pytest.fixture
def replica(deploy, fleet_east):
    """``replica(deployment, url)``: the deployment's next pending replica placed on a100-001
    and running, its model server at ``url`` (as a driver reports it)."""
    node = fleet_east["nodes"]["a100-001"]

    def make(deployment, url: str) -> VirtualMachine:
        vm = deployment.replicas.filter(state=State.PENDING).order_by("pk").first()
        taken = set(
            VirtualMachine.objects.filter(node=node, allocations__released_at=None).values_list(
                "allocations__gpu__index", flat=True
            )
        )
        vm = rentals.vm_place(vm=vm, node=node, gpu_indices=[min(set(range(8)) - taken)])
        return rentals.vm_mark_running(vm=vm, ip_address="127.0.0.1", endpoint_url=url)

    return make


def probe_round(capture) -> dict:
    """One beat tick of ``inference.probe``, with what it publishes on commit."""
    with capture(execute=True):
        return probe_replicas()


def route_ids(deployment) -> list[str]:
    raw = cache.inference_redis().get(cache.route_key(deployment.slug))
    return [replica["id"] for replica in json.loads(raw)["replicas"]] if raw else []


def probe_of(vm) -> ReplicaProbe | None:
    return ReplicaProbe.objects.filter(vm=vm).first()


# --- the router follows the probe ----------------------------------------------------------------


def test_a_replica_is_routed_only_while_its_probe_answers(
    server, key, deploy, replica, model_server, settings, django_capture_on_commit_callbacks
):
    settings.INFERENCE_PROBE_FAILURES = 3
    # With no replica ready a request waits for one up to the cold-start timeout: 1 s here.
    deployment = deploy("chat", min_replicas=1, cold_start_timeout_seconds=1)
    models = model_server()
    vm = replica(deployment, models.url)
    secret = key(deployment)
    cache.route_publish(deployment.pk)  # what its move to running publishes on commit

    # Booted is not up: no probe has answered, so the router sends it nothing.
    refused = chat(server, deployment, secret)
    assert (refused.status_code, refused.json()["error"]["code"]) == (503, "cold_start_timeout")
    assert ("POST", "/v1/chat/completions") not in models.seen

    # One answered probe makes it ready: the route lists it and the router sends it requests.
    assert probe_round(django_capture_on_commit_callbacks) == {
        "probed": 1,
        "answered": 1,
        "recorded": 1,
    }
    assert models.seen == [("GET", "/v1/models")]
    assert route_ids(deployment) == [vm.instance_id]
    answered = wait_until(
        lambda: (response := chat(server, deployment, secret)).status_code == 200 and response,
        what="the router to send the ready replica a request",
    )
    assert answered.headers["x-gpucap-replica"] == vm.instance_id
    assert answered.json()["choices"][0]["message"]["content"] == "hello"
    assert ("POST", "/v1/chat/completions") in models.seen

    # Its model server dies. Two failed probes are not yet enough to drop it...
    models.stop()
    for failures in (1, 2):
        probe_round(django_capture_on_commit_callbacks)
        assert (probe_of(vm).ready, probe_of(vm).consecutive_failures) == (True, failures)
        assert route_ids(deployment) == [vm.instance_id]
    # ...the third in a row is: the router waits for a ready one (then says none is), rather
    # than failing.
    probe_round(django_capture_on_commit_callbacks)
    assert route_ids(deployment) == []
    dropped = probe_of(vm)
    assert (dropped.ready, dropped.consecutive_failures) == (False, 3)
    assert dropped.last_error == (f"cannot connect to {models.url}/v1/models: connection refused")
    wait_until(
        lambda: chat(server, deployment, secret).json()["error"]["code"] == "cold_start_timeout",
        what="the router to drop the replica",
    )

    # It answers again: one probe brings it back.
    models.start()
    probe_round(django_capture_on_commit_callbacks)
    assert route_ids(deployment) == [vm.instance_id]
    back = wait_until(
        lambda: (response := chat(server, deployment, secret)).status_code == 200 and response,
        what="the router to send the replica requests again",
    )
    assert back.headers["x-gpucap-replica"] == vm.instance_id
    verbs = AuditEvent.objects.filter(object_type="virtualmachine", object_id=str(vm.pk))
    assert [e.verb for e in verbs.filter(verb__startswith="replica.").order_by("pk")] == [
        "replica.ready",
        "replica.not_ready",
        "replica.ready",
    ]


def test_a_probe_that_does_not_answer_2xx_or_in_time_fails_with_its_reason(
    deploy, replica, model_server, settings, django_capture_on_commit_callbacks
):
    settings.INFERENCE_PROBE_TIMEOUT_SECONDS = 1
    deployment = deploy("chat", min_replicas=3, max_replicas=3)
    unhealthy = model_server()
    unhealthy.status = 503
    silent = _silent_server()
    loading = replica(deployment, unhealthy.url)
    hung = replica(deployment, f"http://127.0.0.1:{silent.getsockname()[1]}")
    try:
        probe_round(django_capture_on_commit_callbacks)
    finally:
        silent.close()

    assert (probe_of(loading).ready, probe_of(loading).last_error) == (
        False,
        f"{unhealthy.url}/v1/models answered HTTP 503",
    )
    assert probe_of(hung).last_error == (f"no answer from {hung.endpoint_url}/v1/models within 1 s")
    assert route_ids(deployment) == []


def _silent_server():
    """A port that accepts connections (the kernel's backlog) and never answers."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def test_the_health_url_is_the_endpoint_and_the_probe_path(settings, deploy, replica):
    deployment = deploy("chat", min_replicas=1)
    vm = replica(deployment, "http://127.0.0.1:9/")
    assert probe.health_url(vm) == "http://127.0.0.1:9/v1/models"
    settings.INFERENCE_PROBE_PATH = "health"
    assert probe.health_url(vm) == "http://127.0.0.1:9/health"


def test_a_replica_is_probed_on_its_images_health_path(deploy, replica, fleet_east):
    deployment = deploy("chat", min_replicas=1)
    vm = replica(deployment, "http://127.0.0.1:9/")
    fleet.image_update(image=fleet_east["images"][vm.image], health_path="/healthz")

    assert [target.url for target in probe.round_targets()] == ["http://127.0.0.1:9/healthz"]


# --- two probers at once -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_probers_at_once_count_a_failure_once(
    deploy, replica, model_server, settings, monkeypatch
):
    """Two beat ticks overlapping: both rounds read the replica's last probe before either
    records. Only one of their failures counts, so it takes three more rounds, not two, to drop
    a replica that was ready."""
    settings.INFERENCE_PROBE_FAILURES = 3
    deployment = deploy("chat", min_replicas=1)
    models = model_server()
    vm = replica(deployment, models.url)
    probe_replicas()
    assert probe_of(vm).ready
    models.stop()

    both_read = threading.Barrier(2, timeout=30)
    checked = probe.health_check

    def check_together(http, url):
        both_read.wait()  # each round has read the replica's last probe by now
        return checked(http, url)

    monkeypatch.setattr(probe, "health_check", check_together)

    def one_round():
        try:
            return probe.replicas_probe()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        rounds = [pool.submit(one_round) for _ in range(2)]
        recorded = sorted(round_.result().recorded for round_ in rounds)

    assert recorded == [0, 1]
    assert (probe_of(vm).ready, probe_of(vm).consecutive_failures) == (True, 1)
    monkeypatch.setattr(probe, "health_check", checked)
    probe_replicas()
    assert (probe_of(vm).ready, probe_of(vm).consecutive_failures) == (True, 2)
    probe_replicas()
    assert (probe_of(vm).ready, probe_of(vm).consecutive_failures) == (False, 3)


def test_a_round_that_read_before_another_recorded_is_dropped(deploy, replica, model_server):
    """The same race, step by step: the later of two overlapping rounds records nothing."""
    deployment = deploy("chat", min_replicas=1)
    models = model_server()
    vm = replica(deployment, models.url)
    models.stop()
    first, second = probe.round_targets(), probe.round_targets()

    assert probe.outcomes_record(first, probe.health_checks(first)) == 1
    assert probe.outcomes_record(second, probe.health_checks(second)) == 0
    assert probe_of(vm).consecutive_failures == 1


# --- the replica's lifecycle ---------------------------------------------------------------------


def test_a_replica_that_goes_down_waits_for_a_fresh_probe(
    deploy, replica, model_server, django_capture_on_commit_callbacks
):
    deployment = deploy("chat", min_replicas=1, max_replicas=2)
    models = model_server()
    vm = replica(deployment, models.url)
    probe_round(django_capture_on_commit_callbacks)
    assert probe_of(vm).ready

    with django_capture_on_commit_callbacks(execute=True):
        rentals.vm_terminate(vm=vm, for_deployment=True)

    assert probe_of(vm) is None  # what its probes found left with its guest
    assert route_ids(deployment) == []
    # A replica that is not running is not probed, and a late result for it is not kept.
    assert probe_replicas()["probed"] == 0
    assert not probe.services.replica_probe_record(
        vm_id=vm.pk, endpoint_url=models.url, seen_at=None, ok=True, at=vm.started_at
    )
    assert probe_of(vm) is None


def test_a_notified_replica_leaves_the_route_and_is_no_longer_probed(
    deploy, replica, model_server, django_capture_on_commit_callbacks
):
    from gpucap.notices.services import notice_issue

    deployment = deploy("chat", min_replicas=1)
    models = model_server()
    vm = replica(deployment, models.url)
    probe_round(django_capture_on_commit_callbacks)
    assert route_ids(deployment) == [vm.instance_id]

    with django_capture_on_commit_callbacks(execute=True):
        notice_issue(vm=vm, reason="drain", seconds=120)

    assert route_ids(deployment) == []
    models.seen.clear()
    assert probe_replicas()["probed"] == 0
    assert models.seen == []


# --- the simulated driver's replicas -------------------------------------------------------------


def test_a_simulated_replica_is_ready_through_the_probe_and_dropped_when_its_server_dies(
    server, serving, key, sim, settings, django_capture_on_commit_callbacks
):
    settings.INFERENCE_PROBE_FAILURES = 2
    deployment = serving(2)  # ready: the probe asked their model simulator /v1/models
    dying, staying = deployment.replicas.order_by("pk")
    assert sorted(route_ids(deployment)) == sorted([dying.instance_id, staying.instance_id])

    sim.replica_kill(dying.instance_id)
    for _ in range(2):
        probe_round(django_capture_on_commit_callbacks)

    assert route_ids(deployment) == [staying.instance_id]
    assert probe_of(dying).last_error.endswith("closed the connection without an answer")
    secret = key(deployment)
    served = {
        chat(server, deployment, secret).headers.get("x-gpucap-replica") for _ in range(4)
    } - {None}
    assert served == {staying.instance_id}


# --- what operators and tenants see --------------------------------------------------------------


def test_the_replica_list_shows_each_replicas_readiness(
    member_client, member_api, deploy, replica, model_server, django_capture_on_commit_callbacks
):
    deployment = deploy("chat", min_replicas=3, max_replicas=3)
    healthy, unhealthy = model_server(), model_server()
    unhealthy.status = 500
    ready = replica(deployment, healthy.url)
    failing = replica(deployment, unhealthy.url)
    probe_round(django_capture_on_commit_callbacks)
    booted = replica(deployment, healthy.url)  # no probe yet

    page = member_client.get("/tenants/acme/inference/chat/").content.decode()
    assert _cell(page, ready) == "ready"
    assert _cell(page, failing) == f"not ready: {unhealthy.url}/v1/models answered HTTP 500"
    assert _cell(page, booted) == "waiting for first probe"
    assert 'class="ready-replicas">1<' in page

    shown = member_api.get(f"/api/deployments/{deployment.pk}/").json()
    readiness = {r["instance_id"]: r["readiness"] for r in shown["replicas"]}
    assert readiness[ready.instance_id]["status"] == "ready"
    assert readiness[ready.instance_id]["last_probe_at"]
    assert readiness[failing.instance_id] == {
        "status": "not_ready",
        "label": f"not ready: {unhealthy.url}/v1/models answered HTTP 500",
        "last_probe_at": readiness[failing.instance_id]["last_probe_at"],
        "consecutive_failures": 1,
        "last_error": f"{unhealthy.url}/v1/models answered HTTP 500",
    }
    assert readiness[booted.instance_id]["status"] == "waiting"
    assert shown["ready_replicas"] == 1
    listed = member_api.get("/api/deployments/").json()["results"]
    assert [d["ready_replicas"] for d in listed] == [1]

    listing = member_client.get("/tenants/acme/inference/").content.decode()
    assert "· 1 ready" in listing


def test_operators_see_ready_replicas_across_the_fleet(
    operator_client, deploy, replica, model_server, django_capture_on_commit_callbacks
):
    deployment = deploy("chat", min_replicas=2, max_replicas=2)
    models = model_server()
    replica(deployment, models.url)
    replica(deployment, models.url)
    probe_round(django_capture_on_commit_callbacks)

    page = operator_client.get("/deployments/").content.decode()
    assert "<dt>Ready replicas</dt><dd>2</dd>" in page


def _cell(page: str, vm) -> str:
    """The text of a replica row's readiness cell."""
    row = page.split(f'id="replica-{vm.pk}"', 1)[1].split("</tr>", 1)[0]
    cell = row.split('class="replica-readiness">', 1)[1].split("</td>", 1)[0]
    return cell.split(">", 1)[1].split("</span>", 1)[0]
