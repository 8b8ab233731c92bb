"""The inference router as deployed: gpucap.asgi's application under uvicorn on a loopback port,
serving both the router and the model simulator of the simulated replicas (SIMULATOR_BASE_URL
points at it), talked to with the official ``openai`` client and plain HTTP.

Replicas are placed and marked running through the services, with the endpoint the simulated
driver reports, and join the route once the readiness probe (``inference.probe``) has asked
their model simulator ``/v1/models``; the route and key documents are published as the
services publish them."""

import contextlib
import itertools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx2
import openai
import pytest
import uvicorn
from django.utils import timezone
from prometheus_client import REGISTRY

from gpucap.drivers import model_simulator
from gpucap.drivers.base import VmSpec
from gpucap.drivers.model_simulator import answer, chat_prompt
from gpucap.drivers.simulated import SimulatedDriver
from gpucap.inference import cache, router
from gpucap.inference import services as inference
from gpucap.inference.models import ApiKey
from gpucap.inference.tasks import probe_replicas
from gpucap.notices.services import notice_issue
from gpucap.rentals import services as rentals
from tests.conftest import TEST_ROUTER_REDIS_URL
from tests.redis_server import free_port
from tests.rentals.conftest import _record_sent

ROUTER_TEST_REDIS = TEST_ROUTER_REDIS_URL  # from the environment (tests/conftest.py)
MODEL = "gpucap/sim-8b"  # what the deploy fixture serves
HELLO = [{"role": "user", "content": "Say hello"}]
SLOW = {"X-Simulator-TTFT-Ms": "1500"}  # a request that holds its replica for 1.5 s


# --- the server, the replicas, the keys ----------------------------------------------------------


@pytest.fixture(autouse=True)
def inference_redis(settings, monkeypatch):
    """Overrides tests/inference/conftest.py's: these tests run for seconds against a live
    server, so their documents and counters live in a Redis database no other suite flushes,
    under a key prefix of this pytest process."""
    settings.INFERENCE_REDIS_URL = ROUTER_TEST_REDIS
    monkeypatch.setattr(cache, "PREFIX", f"gpucap:inference:test{os.getpid()}:")
    client = cache.inference_redis()
    _delete_matching(client, f"{cache.PREFIX}*")
    client.set(cache.synced_key(), "0")  # synced, with nothing in it: the test database is empty
    yield client
    _delete_matching(client, f"{cache.PREFIX}*")


def _delete_matching(client, pattern: str) -> None:
    keys = list(client.scan_iter(match=pattern, count=500))
    if keys:
        client.delete(*keys)


@pytest.fixture
def server(db, settings, inference_redis):
    """gpucap.asgi.application under uvicorn in a thread; the simulated replicas' model server
    is this same server, answering at once unless a request asks to be slow."""
    import socket

    from gpucap.asgi import application

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    settings.SIMULATOR_ENABLED = True
    settings.SIMULATOR_BASE_URL = base
    settings.SIMULATOR_TTFT_MS = 0
    settings.SIMULATOR_TOKENS_PER_SECOND = 0
    model_simulator.served.clear()
    instance = uvicorn.Server(
        uvicorn.Config(application, proxy_headers=False, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=instance.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not instance.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield base
    instance.should_exit = True
    thread.join(timeout=10)
    sock.close()


@pytest.fixture
def sim():
    """The simulated fleet of this test database (where replica_kill marks a dead replica)."""
    driver = SimulatedDriver({"boot_seconds": 0})
    driver.reset()
    yield driver
    driver.reset()


@pytest.fixture
def serving(deploy, fleet_east, server, sim, django_capture_on_commit_callbacks):
    """``serving(replicas=2, **settings)``: a standalone deployment of acme's whose replicas
    run on a100-001, each with the endpoint the simulated driver gives it, and ready: the
    readiness probe found their model simulator answering."""
    names = iter(["chat", "code", "vision"])
    free_gpus = iter(range(8))

    def make(replicas: int = 2, **settings):
        settings.setdefault("max_replicas", max(replicas, 1))
        deployment = deploy(next(names), min_replicas=replicas, **settings)
        node = fleet_east["nodes"]["a100-001"]
        for vm in deployment.replicas.order_by("pk"):
            vm = rentals.vm_place(vm=vm, node=node, gpu_indices=[next(free_gpus)])
            status = sim.create(
                VmSpec(
                    instance_id=vm.instance_id,
                    node=node.hostname,
                    gpus=(),
                    image=vm.image,
                    ssh_public_key=vm.ssh_public_key,
                    role=vm.role,
                )
            )
            rentals.vm_mark_running(
                vm=vm, ip_address=status.ip_address, endpoint_url=status.endpoint_url
            )
        cache.route_publish(deployment.pk)  # what the services do on commit
        with django_capture_on_commit_callbacks(execute=True):
            assert probe_replicas()["answered"] >= replicas  # ready: the route lists them
        return deployment

    return make


@pytest.fixture
def sent_tasks(monkeypatch) -> list:
    """The tasks services send on commit (a notice's deadline stop), kept from the broker."""
    return _record_sent(monkeypatch, lambda name: not name.startswith("plans."))


@pytest.fixture
def key(tenant):
    """``key(deployment=None, **options)``: a new API key of acme's, published; its secret."""

    def make(deployment=None, *, tenant_=None, **options) -> str:
        api_key, secret = inference.api_key_create(
            tenant=tenant_ or tenant, name="test", deployment=deployment, **options
        )
        cache.key_publish(api_key.pk)
        return secret

    return make


def router_url(server: str, deployment) -> str:
    return f"{server}/inference/{deployment.slug}/v1"


def openai_client(server: str, deployment, secret: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=router_url(server, deployment), api_key=secret, max_retries=0, timeout=20
    )


def chat(server: str, deployment, secret: str, *, headers=None, **payload) -> httpx2.Response:
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 4, **payload}
    return httpx2.post(
        f"{router_url(server, deployment)}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {secret}", **(headers or {})},
        timeout=20,
    )


def replica_ids(deployment) -> list[str]:
    return [vm.instance_id for vm in deployment.replicas.order_by("pk")]


def settled(deployment) -> tuple:
    """The deployment's load once nothing is queued or in flight (slots are given back just
    after the answers leave), or as it is after 5 s."""
    with contextlib.suppress(AssertionError):
        return wait_until(
            lambda: (load := cache.load(deployment.slug))[:2] == (0, 0) and load,
            what="the load to settle",
        )
    return cache.load(deployment.slug)


def wait_until(condition, *, what: str, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


# --- the openai client ----------------------------------------------------------------------------


def test_the_openai_client_chats_streams_and_lists_models_through_the_router(server, serving, key):
    deployment = serving()
    client = openai_client(server, deployment, key(deployment))

    completion = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=5)
    stream = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=5, stream=True)
    chunks = list(stream)
    models = client.models.list()
    text = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3)

    expected = "".join(answer(chat_prompt(HELLO), 5)[0])
    assert completion.choices[0].message.content == expected
    assert completion.usage.completion_tokens == 5
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert len(chunks) == 7  # the role, 5 tokens, the finish
    assert chunks[-1].choices[0].finish_reason == "length"
    assert [(m.id, m.owned_by) for m in models.data] == [(MODEL, "acme")]
    assert models.data[0].created == int(deployment.created_at.timestamp())
    assert text.choices[0].text == "".join(answer("Once upon a time", 3)[0])


def test_a_key_for_all_of_a_tenants_deployments_opens_each(server, serving, key):
    chat_deployment, code_deployment = serving(1), serving(1)
    secret = key()

    assert chat(server, chat_deployment, secret).status_code == 200
    assert chat(server, code_deployment, secret).status_code == 200


def test_a_revoked_key_gets_an_authentication_error(server, serving, key):
    deployment = serving()
    secret = key(deployment)
    client = openai_client(server, deployment, secret)
    client.models.list()

    inference.api_key_revoke(api_key=ApiKey.objects.get())
    cache.key_publish(ApiKey.objects.get().pk)

    with pytest.raises(openai.AuthenticationError) as refused:
        client.chat.completions.create(model=MODEL, messages=HELLO)
    assert refused.value.status_code == 401
    assert refused.value.body["message"] == "This API key has been revoked."
    assert sum(model_simulator.served.values()) == 0


def test_a_key_revoked_after_use_is_refused_at_once(server, serving, key):
    deployment = serving()
    secret = key(deployment)
    assert [chat(server, deployment, secret).status_code for _ in range(3)] == [200] * 3
    served = sum(model_simulator.served.values())

    inference.api_key_revoke(api_key=ApiKey.objects.get())
    cache.key_publish(ApiKey.objects.get().pk)
    refused = chat(server, deployment, secret)

    assert refused.status_code == 401
    assert refused.json()["error"]["message"] == "This API key has been revoked."
    assert sum(model_simulator.served.values()) == served


@pytest.mark.parametrize(
    ("authorization", "message"),
    [
        (None, "You didn't provide an API key"),
        ("Bearer", "You didn't provide an API key"),
        ("Basic dXNlcjpwYXNz", "You didn't provide an API key"),
        ("Bearer sk-not-ours", "Incorrect API key provided: it is not a gpucap key"),
        ("Bearer gpk_AAAAAAAAAA_" + "B" * 40, "Incorrect API key provided."),
        ("wrong secret", "Incorrect API key provided."),
        ("expired", "This API key expired at"),
        ("other tenant", "This API key does not open the deployment"),
        ("other deployment", "This API key does not open the deployment"),
    ],
)
def test_bad_keys_get_401_and_reach_no_replica(
    server, serving, key, other_tenant, authorization, message
):
    deployment = serving()
    if authorization == "wrong secret":
        secret = key(deployment)
        authorization = f"Bearer {secret[:-1]}{'A' if secret[-1] != 'A' else 'B'}"
    elif authorization == "expired":
        secret = key(deployment, expires_at=timezone.now() + timedelta(hours=1))
        ApiKey.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
        cache.key_publish(ApiKey.objects.get().pk)
        authorization = f"Bearer {secret}"
    elif authorization == "other tenant":
        authorization = f"Bearer {key(tenant_=other_tenant)}"
    elif authorization == "other deployment":
        authorization = f"Bearer {key(serving(1))}"
    headers = {} if authorization is None else {"Authorization": authorization}

    response = httpx2.post(
        f"{router_url(server, deployment)}/chat/completions",
        json={"model": MODEL, "messages": HELLO},
        headers=headers,
        timeout=10,
    )

    assert response.status_code == 401
    error = response.json()["error"]
    assert error["message"].startswith(message)
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        None,
        "invalid_api_key",
    )
    assert response.headers["www-authenticate"] == "Bearer"
    assert sum(model_simulator.served.values()) == 0


def test_a_deployment_that_does_not_exist_answers_like_another_tenants(server, serving, key):
    deployment = serving()
    secret = key()

    response = httpx2.get(
        f"{server}/inference/no-such-thing/v1/models",
        headers={"Authorization": f"Bearer {secret}"},
    )
    theirs = chat(server, deployment, secret)

    assert response.status_code == 401 and theirs.status_code == 200
    assert "/inference/no-such-thing/" in response.json()["error"]["message"]


# --- requests the router refuses itself ----------------------------------------------------------


def test_another_model_is_not_found(server, serving, key):
    deployment = serving()
    client = openai_client(server, deployment, key(deployment))

    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert missing.value.body["code"] == "model_not_found"
    assert "`gpt-4o`" in missing.value.body["message"]
    assert sum(model_simulator.served.values()) == 0


def test_a_request_without_a_model_goes_to_the_deployments(server, serving, key):
    deployment = serving()

    response = chat(server, deployment, key(deployment), model=None)

    assert response.status_code == 200


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"{not json", "The request body is not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"model": "gpucap/sim-8b"}', "messages:"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "stream:"),
        (b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nested more than 32 levels"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_problem(server, serving, key, body, problem):
    deployment = serving()

    response = httpx2.post(
        f"{router_url(server, deployment)}/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {key(deployment)}"},
    )

    assert response.status_code == 400
    assert problem in response.json()["error"]["message"]
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert sum(model_simulator.served.values()) == 0


def test_an_unhandled_error_is_an_openai_style_500_with_a_request_id(
    server, serving, key, monkeypatch, caplog
):
    deployment = serving()

    def broken(body, route, *, chat):
        raise RuntimeError("the router is on fire")

    monkeypatch.setattr(router, "_payload_check", broken)

    response = chat(server, deployment, key(deployment))

    assert response.status_code == 500
    request_id = response.headers["X-Request-Id"]
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "internal_error")
    assert request_id in error["message"]
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged and logged[0].exc_info is not None


def test_unknown_paths_and_methods_get_openai_errors(server, serving, key):
    deployment = serving()
    headers = {"Authorization": f"Bearer {key(deployment)}"}

    unknown = httpx2.post(f"{router_url(server, deployment)}/embeddings", headers=headers)
    wrong_method = httpx2.get(f"{router_url(server, deployment)}/chat/completions", headers=headers)
    model = httpx2.get(f"{router_url(server, deployment)}/models/gpucap%2Fsim-8b", headers=headers)

    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_url"
    assert wrong_method.status_code == 405
    assert model.status_code == 200 and model.json()["id"] == MODEL


# --- choosing a replica ---------------------------------------------------------------------------


def test_the_replica_with_fewest_requests_in_flight_gets_the_next(server, serving, key):
    deployment = serving(2)
    secret = key(deployment)
    with ThreadPoolExecutor(max_workers=1) as pool:
        slow = pool.submit(chat, server, deployment, secret, headers=SLOW)
        _, _, held = wait_until(
            lambda: (load := cache.load(deployment.slug))[1] == 1 and load,
            what="the slow request to be in flight",
        )
        busy = next(replica for replica, n in held.items() if n == 1)
        quick = [chat(server, deployment, secret) for _ in range(4)]
        (idle,) = set(replica_ids(deployment)) - {busy}
        # A slot is given back just after its answer went out.
        wait_until(
            lambda: cache.load(deployment.slug)[2] == {busy: 1, idle: 0},
            what="the quick requests' slots to be given back while the slow one is held",
        )

    assert [response.headers["x-gpucap-replica"] for response in quick] == [idle] * 4
    assert slow.result().headers["x-gpucap-replica"] == busy
    assert settled(deployment) == (0, 0, {busy: 0, idle: 0})


def test_equally_busy_replicas_take_turns(server, serving, key):
    deployment = serving(2)
    secret = key(deployment)

    served = [chat(server, deployment, secret).headers["x-gpucap-replica"] for _ in range(6)]

    assert sorted(served) == sorted(replica_ids(deployment) * 3)


def test_past_the_queue_bound_the_router_answers_429_with_retry_after(server, serving, key):
    deployment = serving(1, replica_concurrency=1, target_in_flight=1, queue_limit=1)
    secret = key(deployment)
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(chat, server, deployment, secret, headers=SLOW)
        wait_until(lambda: cache.load(deployment.slug)[1] == 1, what="one request in flight")
        second = pool.submit(chat, server, deployment, secret, headers=SLOW)
        wait_until(lambda: cache.load(deployment.slug)[0] == 1, what="one request queued")
        third = chat(server, deployment, secret)
        client = openai_client(server, deployment, secret)
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model=MODEL, messages=HELLO)
        first_done, second_done = first.result(), second.result()

    assert third.status_code == 429
    assert third.headers["retry-after"] == "1"
    assert third.json()["error"]["type"] == "rate_limit_error"
    assert third.json()["error"]["code"] == "rate_limit_exceeded"
    assert (first_done.status_code, second_done.status_code) == (200, 200)
    assert model_simulator.served[replica_ids(deployment)[0]] == 2
    assert settled(deployment) == (0, 0, {replica_ids(deployment)[0]: 0})


def test_a_queued_request_is_answered_when_a_slot_frees(server, serving, key):
    deployment = serving(1, replica_concurrency=1, target_in_flight=1, queue_limit=4)
    secret = key(deployment)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=3) as pool:
        answers = list(pool.map(lambda _: chat(server, deployment, secret), range(3)))
        slow = pool.submit(chat, server, deployment, secret, headers={"X-Simulator-TTFT-Ms": "400"})
        wait_until(lambda: cache.load(deployment.slug)[1] == 1, what="one request in flight")
        queued = chat(server, deployment, secret)

    assert [response.status_code for response in answers] == [200, 200, 200]
    assert queued.status_code == 200 and slow.result().status_code == 200
    assert time.monotonic() - started >= 0.4
    assert settled(deployment)[:2] == (0, 0)


# --- replicas that leave or fail ---------------------------------------------------------------


def test_a_notified_replica_gets_no_traffic(
    server, serving, key, django_capture_on_commit_callbacks, sent_tasks
):
    deployment = serving(2)
    secret = key(deployment)
    leaving, staying = deployment.replicas.order_by("pk")
    with django_capture_on_commit_callbacks(execute=True):
        notice_issue(vm=leaving, reason="drain", seconds=120)

    served = [chat(server, deployment, secret).headers["x-gpucap-replica"] for _ in range(8)]

    assert served == [staying.instance_id] * 8
    assert model_simulator.served[leaving.instance_id] == 0
    assert [name for name, _ in sent_tasks] == ["notices.deadline_stop"]


def test_a_replica_notified_after_serving_gets_no_more_traffic(
    server, serving, key, django_capture_on_commit_callbacks, sent_tasks
):
    deployment = serving(2)
    secret = key(deployment)
    leaving, staying = deployment.replicas.order_by("pk")
    before = {chat(server, deployment, secret).headers["x-gpucap-replica"] for _ in range(4)}

    with django_capture_on_commit_callbacks(execute=True):
        notice_issue(vm=leaving, reason="drain", seconds=120)
    served_before = model_simulator.served[leaving.instance_id]
    after = [chat(server, deployment, secret).headers["x-gpucap-replica"] for _ in range(6)]

    assert before == {leaving.instance_id, staying.instance_id}
    assert after == [staying.instance_id] * 6
    assert model_simulator.served[leaving.instance_id] == served_before


def test_a_request_queued_before_a_notice_does_not_go_to_the_notified_replica(
    server, serving, key, django_capture_on_commit_callbacks, sent_tasks
):
    deployment = serving(2, replica_concurrency=1, target_in_flight=1, queue_limit=4)
    secret = key(deployment)
    in_flight = lambda: cache.load(deployment.slug)[2]  # noqa: E731
    with ThreadPoolExecutor(max_workers=3) as pool:
        short = pool.submit(
            chat, server, deployment, secret, headers={"X-Simulator-TTFT-Ms": "600"}
        )
        wait_until(lambda: sum(in_flight().values()) == 1, what="a first request in flight")
        # The shorter request's replica frees first: without the notice the queued one goes there.
        freeing_first = next(replica for replica, n in in_flight().items() if n == 1)
        long = pool.submit(
            chat, server, deployment, secret, headers={"X-Simulator-TTFT-Ms": "1500"}
        )
        wait_until(lambda: sum(in_flight().values()) == 2, what="both replicas busy")
        waiting = pool.submit(chat, server, deployment, secret)
        wait_until(lambda: cache.load(deployment.slug)[0] == 1, what="a request queued")
        with django_capture_on_commit_callbacks(execute=True):
            notice_issue(vm=replicas_by_id(deployment)[freeing_first], reason="drain")
        answered = waiting.result()

    assert short.result().headers["x-gpucap-replica"] == freeing_first
    assert answered.status_code == 200
    assert answered.headers["x-gpucap-replica"] == long.result().headers["x-gpucap-replica"]
    assert answered.headers["x-gpucap-replica"] != freeing_first
    assert model_simulator.served[freeing_first] == 1


def replicas_by_id(deployment) -> dict:
    return {vm.instance_id: vm for vm in deployment.replicas.all()}


def test_when_a_replica_dies_requests_fail_over_to_the_other(server, serving, key, sim):
    deployment = serving(2)
    secret = key(deployment)
    dead, alive = replica_ids(deployment)
    sim.replica_kill(dead)
    client = openai_client(server, deployment, secret)

    answers = [
        client.chat.completions.with_raw_response.create(model=MODEL, messages=HELLO)
        for _ in range(6)
    ]

    assert {raw.headers["x-gpucap-replica"] for raw in answers} == {alive}
    assert all(raw.parse().choices[0].message.content for raw in answers)
    assert model_simulator.served[dead] == 0
    failing_until = cache.inference_redis().zscore(f"{cache.PREFIX}failing:{deployment.slug}", dead)
    assert failing_until is not None and failing_until > time.time()
    assert settled(deployment) == (0, 0, {dead: 0, alive: 0})


def test_when_every_replica_is_dead_the_answer_is_502(server, serving, key, sim):
    deployment = serving(2)
    for replica in replica_ids(deployment):
        sim.replica_kill(replica)

    response = chat(server, deployment, key(deployment))

    assert response.status_code == 502
    assert response.json()["error"]["code"] == "replica_failed"
    assert settled(deployment)[:2] == (0, 0)


def test_a_streamed_answer_passes_through_chunk_by_chunk(server, serving, key):
    deployment = serving(1)
    arrivals = []
    with httpx2.stream(
        "POST",
        f"{router_url(server, deployment)}/completions",
        json={"model": MODEL, "prompt": "Once", "max_tokens": 4, "stream": True},
        headers={
            "Authorization": f"Bearer {key(deployment)}",
            "X-Simulator-Tokens-Per-Second": "10",
        },
        timeout=10,
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                arrivals.append((time.monotonic(), line))

    assert response.headers["content-type"].startswith("text/event-stream")
    assert arrivals[-1][1] == "data: [DONE]"
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals[:4])]
    assert all(gap >= 0.08 for gap in gaps), gaps


def test_a_client_that_leaves_mid_stream_gives_its_slot_back(server, serving, key):
    deployment = serving(1)
    (replica,) = replica_ids(deployment)
    with httpx2.stream(
        "POST",
        f"{router_url(server, deployment)}/chat/completions",
        json={"model": MODEL, "messages": HELLO, "max_tokens": 100, "stream": True},
        headers={
            "Authorization": f"Bearer {key(deployment)}",
            "X-Simulator-Tokens-Per-Second": "5",
        },
        timeout=10,
    ) as response:
        first = next(response.iter_lines())
        assert cache.load(deployment.slug)[2] == {replica: 1}, (response.status_code, first)

    wait_until(
        lambda: cache.load(deployment.slug)[2] == {replica: 0}, what="the slot to be given back"
    )


def test_a_client_that_leaves_the_queue_gives_its_place_back(server, serving, key):
    deployment = serving(1, replica_concurrency=1, target_in_flight=1, queue_limit=4)
    secret = key(deployment)
    with ThreadPoolExecutor(max_workers=1) as pool:
        held = pool.submit(chat, server, deployment, secret, headers=SLOW)
        wait_until(lambda: cache.load(deployment.slug)[1] == 1, what="one request in flight")
        with pytest.raises(httpx2.ReadTimeout):
            httpx2.post(
                f"{router_url(server, deployment)}/chat/completions",
                json={"model": MODEL, "messages": HELLO},
                headers={"Authorization": f"Bearer {secret}"},
                timeout=0.3,
            )
        wait_until(lambda: cache.load(deployment.slug)[0] == 0, what="the queue to empty")
        assert held.result().status_code == 200

    assert settled(deployment) == (0, 0, {replica_ids(deployment)[0]: 0})
    assert sum(model_simulator.served.values()) == 1


# --- what the router records --------------------------------------------------------------------


def _metric(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_answered_requests_are_counted_in_the_metrics_with_status_and_latency(server, serving, key):
    deployment = serving(1)
    secret = key(deployment)
    slug = deployment.slug
    ok, not_found = (
        _metric("gpucap_router_requests_total", deployment=slug, code=code)
        for code in ("200", "404")
    )
    timed = _metric("gpucap_router_request_duration_seconds_count", deployment=slug)
    over_100ms = timed - _metric(
        "gpucap_router_request_duration_seconds_bucket", deployment=slug, le="0.1"
    )
    unknown = _metric("gpucap_router_requests_total", deployment="unknown", code="401")

    for _ in range(3):
        chat(server, deployment, secret)
    chat(server, deployment, secret, model="no-such-model")
    chat(server, deployment, "gpk_AAAAAAAAAA_" + "B" * 40)
    slow = chat(server, deployment, secret, headers={"X-Simulator-TTFT-Ms": "200"})

    assert slow.status_code == 200
    # A request is counted just after its last byte left.
    wait_until(
        lambda: (
            _metric("gpucap_router_request_duration_seconds_count", deployment=slug) == timed + 5
        ),
        what="the last answer to be counted",
    )
    assert _metric("gpucap_router_requests_total", deployment=slug, code="200") == ok + 4
    assert _metric("gpucap_router_requests_total", deployment=slug, code="404") == not_found + 1
    assert _metric("gpucap_router_requests_total", deployment="unknown", code="401") == unknown + 1
    assert _metric("gpucap_router_request_duration_seconds_count", deployment=slug) == timed + 5
    # The slow answer took 200 ms to its last byte: it lands above the 0.1 s bucket.
    assert (
        timed
        + 5
        - _metric("gpucap_router_request_duration_seconds_bucket", deployment=slug, le="0.1")
        >= over_100ms + 1
    )


def test_requests_are_counted_and_the_keys_use_recorded(server, serving, key):
    deployment = serving(2)
    secret = key(deployment)
    before = time.time()

    for _ in range(5):
        chat(server, deployment, secret)
    inference.api_keys_used_flush()

    client = cache.inference_redis()
    now = int(time.time())
    counted = client.mget([cache.requests_key(deployment.slug, s) for s in range(now - 5, now + 1)])
    assert sum(int(n) for n in counted if n) == 5
    used = ApiKey.objects.get().last_used_at
    assert used is not None and used.timestamp() >= before - 0.001


# --- faults: Redis down, or back without its data ------------------------------------------------


def test_while_redis_is_down_the_router_answers_503_with_retry_after(
    server, serving, key, settings
):
    deployment = serving(1)
    secret = key(deployment)
    settings.INFERENCE_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there

    response = chat(server, deployment, secret)

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "router_unavailable"
    assert "cannot reach its store" in response.json()["error"]["message"]
    assert response.headers["retry-after"] == "1"


def test_a_store_back_empty_is_rebuilt_at_once_and_a_valid_key_is_never_refused(
    transactional_db, server, serving, key, settings, own_redis
):
    settings.INFERENCE_REDIS_URL = own_redis.url()
    deployment = serving(1)
    secret = key(deployment)
    cache.inference_resync()  # the periodic resync has run
    assert chat(server, deployment, secret).status_code == 200

    own_redis.restart_empty()
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        response = chat(server, deployment, secret)
        seen.append(response.status_code)
        if response.status_code != 503:
            break
        assert response.headers["retry-after"] == "1"
        time.sleep(0.05)

    # Never a 401 meanwhile: the documents were rebuilt at once, not waited for.
    assert response.status_code == 200, (seen, response.text)
    # Synced again, a key that does not exist is refused.
    assert chat(server, deployment, "gpk_AAAAAAAAAA_" + "A" * 40).status_code == 401
