"""Inference from zero (#17): a request to a deployment with no replica ready waits in the
router's queue (counted where the autoscaler reads it, within ``queue_limit``), wakes the
deployment (the router sends ``inference.wake``, debounced), and is answered once a replica is
ready; past the deployment's cold-start timeout it is a 503 with ``Retry-After``. Either way,
and when its client leaves first, its place in the queue is given back.

The router runs as tests/inference/test_router.py runs it (gpucap.asgi under uvicorn, real
Redis, the simulated replicas' model server); the task the router sends is recorded and run
here as the worker runs it, and the replica it asks for boots through the services, as the
``serving`` fixture boots its replicas. tests/inference/test_autoscaler.py has the wake-up with
a real worker, inside a capacity set, and the way back to zero."""

import contextlib
from concurrent.futures import ThreadPoolExecutor

import httpx2
import openai
import pytest

from gpucap.drivers.base import VmSpec
from gpucap.inference import cache, router, tasks
from gpucap.inference.autoscaler import Scaling
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.inference import test_router as router_tests
from tests.inference.test_router import HELLO, MODEL, chat, openai_client, router_url, wait_until
from tests.rentals.conftest import _record_sent

# The router's server, its Redis and the simulated fleet, as the router tests have them.
inference_redis = router_tests.inference_redis
server = router_tests.server
sim = router_tests.sim
key = router_tests.key


@pytest.fixture(autouse=True)
def woken_forgotten():
    """Each test starts with no deployment woken lately by this process's router."""
    router._woken.clear()
    yield
    router._woken.clear()


@pytest.fixture
def sent(monkeypatch) -> list:
    """The tasks sent to the broker (the router's wake-ups among them), kept from it."""
    return _record_sent(monkeypatch, lambda name: not name.startswith("plans."))


def wakes(sent: list, deployment) -> list:
    return [args for name, args in sent if name == "inference.wake" and args == [deployment.slug]]


def queued(deployment) -> int:
    return cache.load(deployment.slug)[0]


def boot(vm: VirtualMachine, node, sim, capture) -> None:
    """What placement, the driver and the readiness probe do for a replica asked for."""
    vm = rentals.vm_place(vm=vm, node=node, gpu_indices=[0])
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
    with capture(execute=True):
        rentals.vm_mark_running(
            vm=vm, ip_address=status.ip_address, endpoint_url=status.endpoint_url
        )
        assert tasks.probe_replicas()["answered"] == 1


@pytest.fixture
def at_zero(deploy, server, django_capture_on_commit_callbacks):
    """``at_zero(name, **settings)``: a standalone deployment of acme's with min_replicas 0 and
    no replica, its route published."""

    def make(name: str = "chat", **settings):
        settings.setdefault("max_replicas", 1)
        with django_capture_on_commit_callbacks(execute=True):
            deployment = deploy(name, min_replicas=0, **settings)
        assert deployment.replicas.count() == 0
        return deployment

    return make


def test_a_deployment_at_zero_wakes_on_a_request_and_serves_it_through_the_openai_client(
    server, at_zero, key, sim, sent, fleet_east, django_capture_on_commit_callbacks
):
    deployment = at_zero()
    client = openai_client(server, deployment, key(deployment))
    client = client.with_options(timeout=60)
    with ThreadPoolExecutor(max_workers=2) as pool:
        answer = pool.submit(
            client.chat.completions.create, model=MODEL, messages=HELLO, max_tokens=5
        )
        streamed = pool.submit(
            lambda: list(
                client.chat.completions.create(
                    model=MODEL, messages=HELLO, max_tokens=5, stream=True
                )
            )
        )
        # Both wait in the queue the autoscaler reads, and the router woke the deployment.
        wait_until(lambda: queued(deployment) == 2, what="two requests queued", timeout=20)
        wait_until(lambda: wakes(sent, deployment), what="the router to wake it", timeout=20)
        assert not answer.done() and not streamed.done()

        # The worker runs the wake-up: the autoscaler asks for one replica at once.
        woken = tasks.wake(deployment.slug)
        assert woken.startswith(f"{deployment.slug}: up 0->1 replicas (load 2")
        (replica,) = deployment.replicas.all()
        assert replica.state == VirtualMachine.State.PENDING
        boot(replica, fleet_east["nodes"]["a100-001"], sim, django_capture_on_commit_callbacks)

        completion = answer.result(timeout=60)
        chunks = streamed.result(timeout=60)

    assert completion.model == MODEL and completion.choices[0].message.content
    assert chunks and chunks[0].model == MODEL
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert router_tests.settled(deployment)[:2] == (0, 0)
    # Later requests go straight to the replica, waking nothing.
    before = len(wakes(sent, deployment))
    assert chat(server, deployment, key(deployment)).status_code == 200
    assert len(wakes(sent, deployment)) == before


def test_past_the_cold_start_timeout_a_request_gets_503_with_retry_after(
    server, at_zero, key, sent
):
    # No worker and no capacity: the replica the wake-up would ask for never starts.
    deployment = at_zero(cold_start_timeout_seconds=2)
    client = openai_client(server, deployment, key(deployment))

    with pytest.raises(openai.InternalServerError) as refused:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=5)
    response = chat(server, deployment, key(deployment))

    assert refused.value.status_code == 503
    assert refused.value.response.headers["retry-after"] == "2"
    assert response.status_code == 503 and response.headers["retry-after"] == "2"
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "cold_start_timeout")
    assert "cold-start timeout of 2 s" in error["message"]
    assert wakes(sent, deployment)  # it did ask for a replica
    # Each gave its place in the queue back.
    assert router_tests.settled(deployment)[:2] == (0, 0)


def test_a_request_waiting_at_zero_is_load_and_leaves_the_queue_with_its_client(
    server, at_zero, key, sent
):
    deployment = at_zero(cold_start_timeout_seconds=600, queue_limit=1)
    secret = key(deployment)
    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(
            httpx2.post,
            f"{router_url(server, deployment)}/chat/completions",
            json={"model": MODEL, "messages": HELLO},
            headers={"Authorization": f"Bearer {secret}"},
            timeout=1.5,
        )
        wait_until(lambda: queued(deployment) == 1, what="the request to queue", timeout=20)
        # The autoscaler reads it as load: one replica wanted.
        assert cache.load(deployment.slug)[:2] == (1, 0)
        # Beyond the queue limit the answer is 429, as with busy replicas.
        full = chat(server, deployment, secret)
        assert full.status_code == 429 and full.headers["retry-after"] == "1"
        assert "no replica is ready" in full.json()["error"]["message"]
        with pytest.raises(httpx2.ReadTimeout):
            waiting.result(timeout=30)  # the client gives up and leaves

    wait_until(lambda: queued(deployment) == 0, what="the queue to empty", timeout=20)
    with contextlib.suppress(AssertionError):  # and stays empty
        wait_until(lambda: queued(deployment) != 0, what="a leak", timeout=0.5)
    assert cache.load(deployment.slug)[:2] == (0, 0)


def test_requests_queued_at_zero_wake_the_deployment_once_per_interval(
    server, at_zero, key, sent, monkeypatch
):
    monkeypatch.setattr(router, "WAKE_SECONDS", 3600)  # one interval for the whole test
    deployment = at_zero(cold_start_timeout_seconds=1)
    secret = key(deployment)

    with ThreadPoolExecutor(max_workers=3) as pool:
        answers = list(pool.map(lambda _: chat(server, deployment, secret), range(3)))
    later = chat(server, deployment, secret)

    assert [a.status_code for a in [*answers, later]] == [503] * 4
    assert len(wakes(sent, deployment)) == 1
    assert router_tests.settled(deployment)[:2] == (0, 0)


def test_the_wake_up_of_a_quiet_deployment_asks_for_nothing(at_zero, sent):
    deployment = at_zero()
    assert tasks.wake(deployment.slug).endswith(f"{Scaling.STEADY} 0->0 replicas (load 0, wants 0)")
    assert tasks.wake("no-such-deployment") is None
    assert deployment.replicas.count() == 0
