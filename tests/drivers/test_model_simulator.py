"""The model simulator the simulated driver's inference replicas serve: OpenAI's wire format,
deterministic text, latency as configured, and a killed replica that fails like a crashed
server. Served by gpucap.asgi's application under uvicorn, as `make run` serves it."""

import itertools
import json
import socket
import threading
import time

import httpx2
import pytest
import uvicorn

from gpucap.drivers import model_simulator
from gpucap.drivers.model_simulator import answer, chat_prompt
from gpucap.drivers.simulated import SimulatedDriver
from tests.drivers.conftest import vm_spec

INSTANT = {"X-Simulator-TTFT-Ms": "0", "X-Simulator-Tokens-Per-Second": "0"}
HELLO = [{"role": "user", "content": "Say hello"}]


@pytest.fixture
def server(db, settings):
    """gpucap.asgi.application under uvicorn in a thread, on a free loopback port."""
    from gpucap.asgi import application

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    settings.SIMULATOR_ENABLED = True
    settings.SIMULATOR_BASE_URL = base
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
def replica(server):
    """A client of one simulated replica's model server."""
    with httpx2.Client(base_url=f"{server}/simulated/replicas/vm-7", timeout=10) as client:
        yield client


def sse_events(body: str) -> list:
    """The data of each server-sent event, JSON-decoded except the final [DONE]."""
    events = [block for block in body.split("\n\n") if block]
    assert all(block.startswith("data: ") for block in events), body
    data = [block.removeprefix("data: ") for block in events]
    return [item if item == "[DONE]" else json.loads(item) for item in data]


# --- the simulated model -------------------------------------------------------------------------


def test_the_same_prompt_always_gets_the_same_answer_and_others_another():
    first = answer("user: Say hello", 64)
    assert answer("user: Say hello", 64) == first
    assert answer("user: Say goodbye", 64) != first
    tokens, finish = first
    assert tokens[0][0].isupper() and all(token.startswith(" ") for token in tokens[1:])
    assert finish == "stop" and tokens[-1].endswith(".")


def test_max_tokens_cuts_the_answer_short():
    tokens, finish = answer("user: Tell me a long story", 3)

    assert len(tokens) == 3 and finish == "length"
    assert tokens == answer("user: Tell me a long story", 64)[0][:3]


def test_a_chat_completion_in_openais_format(replica):
    response = replica.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": HELLO, "max_tokens": 5},
        headers=INSTANT,
    )

    assert response.status_code == 200, response.text
    body = response.json()
    tokens, finish = answer(chat_prompt(HELLO), 5)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "m"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(tokens), "refusal": None},
            "logprobs": None,
            "finish_reason": finish,
        }
    ]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


def test_max_tokens_defaults_to_16(replica):
    response = replica.post(
        "/v1/completions", json={"model": "m", "prompt": "Once upon a time"}, headers=INSTANT
    )

    assert response.json()["usage"]["completion_tokens"] == len(answer("Once upon a time", 16)[0])
    assert response.json()["choices"][0]["text"] == "".join(answer("Once upon a time", 16)[0])


def test_a_streamed_chat_completion_is_server_sent_chunks_ending_with_done(replica):
    response = replica.post(
        "/v1/chat/completions",
        json={
            "model": "m",
            "messages": HELLO,
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        headers=INSTANT,
    )

    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    tokens, finish = answer(chat_prompt(HELLO), 4)
    chunks = events[:-1]
    assert events[-1] == "[DONE]"
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [chunk["choices"][0]["delta"]["content"] for chunk in chunks[1:5]] == tokens
    assert chunks[5]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": finish,
    }
    assert chunks[6]["choices"] == [] and chunks[6]["usage"]["completion_tokens"] == 4


def test_a_streamed_completion_uses_text_completion_chunks(replica):
    response = replica.post(
        "/v1/completions",
        json={"model": "m", "prompt": "Once", "max_tokens": 3, "stream": True},
        headers=INSTANT,
    )

    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    assert {chunk["object"] for chunk in events[:-1]} == {"text_completion"}
    text = "".join(chunk["choices"][0]["text"] for chunk in events[:-1])
    assert text == "".join(answer("Once", 3)[0])
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_time_to_first_token_and_tokens_per_second_are_honoured(replica):
    started = time.monotonic()
    replica.post(
        "/v1/completions",
        json={"prompt": "Once", "max_tokens": 6},
        headers={"X-Simulator-TTFT-Ms": "200", "X-Simulator-Tokens-Per-Second": "50"},
    )
    took = time.monotonic() - started

    assert 0.2 + 5 / 50 <= took < 1.5


def test_streamed_tokens_arrive_one_by_one(replica):
    arrivals = []
    with replica.stream(
        "POST",
        "/v1/completions",
        json={"prompt": "Once", "max_tokens": 4, "stream": True},
        headers={"X-Simulator-TTFT-Ms": "0", "X-Simulator-Tokens-Per-Second": "10"},
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic())

    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert len(arrivals) == 5 and all(gap >= 0.08 for gap in gaps[:3])


def test_the_latency_defaults_come_from_the_settings(replica, settings):
    settings.SIMULATOR_TTFT_MS = 300
    settings.SIMULATOR_TOKENS_PER_SECOND = 0
    started = time.monotonic()
    replica.post("/v1/completions", json={"prompt": "Once", "max_tokens": 2})

    assert time.monotonic() - started >= 0.3


def test_a_time_to_first_token_past_the_cap_is_refused_at_once(replica, settings):
    settings.SIMULATOR_MAX_DELAY_SECONDS = 1

    response = replica.post(
        "/v1/completions",
        json={"prompt": "Once", "max_tokens": 2},
        headers={"X-Simulator-TTFT-Ms": "5000"},
    )

    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "x-simulator-ttft-ms: must be at most 1000" in message
    assert "SIMULATOR_MAX_DELAY_SECONDS" in message


def test_slow_tokens_are_sped_up_so_an_answer_never_takes_longer_than_the_cap(settings):
    settings.SIMULATOR_MAX_DELAY_SECONDS = 30
    slowest = {b"x-simulator-ttft-ms": b"29000", b"x-simulator-tokens-per-second": b"0.001"}

    ttft, interval = model_simulator.delays(slowest, 64)

    assert ttft == 29
    assert ttft + interval * 63 <= 30
    assert model_simulator.delays({b"x-simulator-tokens-per-second": b"10"}, 5)[1] == 0.1


def test_the_simulator_is_not_served_unless_enabled(server, settings):
    settings.SIMULATOR_ENABLED = False

    response = httpx2.get(f"{server}/simulated/replicas/vm-7/v1/models", timeout=10)

    assert response.status_code == 404
    assert "gpucap-simulator" not in response.text


def test_models_lists_the_simulator(replica):
    assert replica.get("/v1/models").json()["data"][0]["id"] == model_simulator.MODEL


@pytest.mark.parametrize(
    ("path", "body", "status", "problem"),
    [
        ("/v1/chat/completions", b"{not json", 400, "must be JSON"),
        ("/v1/chat/completions", b'{"messages": []}', 400, "messages"),
        ("/v1/completions", b'{"prompt": "a", "max_tokens": -1}', 400, "max_tokens"),
        ("/v1/completions", b'{"prompt": 7}', 400, "prompt"),
        ("/v1/embeddings", b"{}", 404, "Unknown request URL"),
    ],
)
def test_bad_requests_get_openai_style_errors(replica, path, body, status, problem):
    response = replica.post(path, content=body, headers=INSTANT)

    assert response.status_code == status
    assert problem in response.json()["error"]["message"]


# --- the replica's endpoint and its death -------------------------------------------------------


def test_an_inference_replica_reports_the_simulators_url_as_its_endpoint(server):
    driver = SimulatedDriver({"boot_seconds": 0})
    try:
        replica = driver.create(vm_spec("vm-11", role="inference_replica"))
        rental = driver.create(vm_spec("vm-12"))
    finally:
        driver.reset()

    assert replica.endpoint_url == f"{server}/simulated/replicas/vm-11"
    assert rental.endpoint_url is None


def test_a_killed_replica_drops_connections_without_an_answer(server, replica):
    driver = SimulatedDriver()
    served = model_simulator.served["vm-7"]
    driver.replica_kill("vm-7")
    try:
        with pytest.raises(httpx2.TransportError):
            replica.post("/v1/completions", json={"prompt": "Once"}, headers=INSTANT)
        port = int(server.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(b"GET /simulated/replicas/vm-7/v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                received = raw.recv(1024)
            except ConnectionResetError:
                received = b""
        other = httpx2.get(f"{server}/simulated/replicas/vm-8/v1/models", timeout=5)
    finally:
        driver.replica_revive("vm-7")

    assert received == b""  # not even a status line
    assert other.status_code == 200  # the others live on
    assert model_simulator.served["vm-7"] == served
    revived = replica.post("/v1/completions", json={"prompt": "Once"}, headers=INSTANT)
    assert revived.status_code == 200
