"""gpucap.edge.http: the body the apps read and the bytes they answer, and how each app answers
a body it cannot have (its own status and words, as before the edge was shared)."""

import json

import pytest

from gpucap.drivers import model_simulator
from gpucap.edge.http import (
    BodyTooLarge,
    ClientGone,
    read_body,
    send_body,
    send_json,
    send_text,
)
from gpucap.inference import router
from gpucap.notices import metadata
from tests.conftest import run_in_new_loop


def client_sending(*messages):
    """A ``receive`` handing over ``messages``, then the client's disconnect."""
    queue = list(messages)

    async def receive():
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    return receive


def chunk(body: bytes, *, more: bool = False) -> dict:
    return {"type": "http.request", "body": body, "more_body": more}


def read(receive, limit: int):
    return run_in_new_loop(lambda: read_body(receive, limit=limit))


def answered(answer) -> list[dict]:
    sent = []

    async def send(message):
        sent.append(message)

    run_in_new_loop(lambda: answer(send))
    return sent


def test_read_body_joins_the_messages_of_one_body():
    assert read(client_sending(chunk(b"ab", more=True), chunk(b"cd")), 4) == b"abcd"
    assert read(client_sending(chunk(b"abcd")), 4) == b"abcd"
    assert read(client_sending({"type": "http.request"}), 4) == b""


def test_read_body_raises_client_gone_when_the_client_leaves_first():
    with pytest.raises(ClientGone):
        read(client_sending(chunk(b"ab", more=True)), 4)


def test_read_body_stops_at_the_message_that_goes_past_the_limit():
    receive = client_sending(chunk(b"abc", more=True), chunk(b"de", more=True), chunk(b"never"))
    with pytest.raises(BodyTooLarge) as raised:
        read(receive, 4)
    assert raised.value.limit == 4
    assert raised.value.received == b"abcde"


def test_send_body_gives_type_and_length_first_then_the_extra_headers():
    sent = answered(
        lambda send: send_body(send, 201, b"hi", content_type=b"x/y", headers=[(b"a", b"1")])
    )
    assert sent == [
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [(b"content-type", b"x/y"), (b"content-length", b"2"), (b"a", b"1")],
        },
        {"type": "http.response.body", "body": b"hi"},
    ]


def test_send_json_is_plain_or_compact_and_send_text_is_utf8():
    payload = {"a": [1, 2], "b": "é"}
    plain = answered(lambda send: send_json(send, 200, payload))
    compact = answered(lambda send: send_json(send, 200, payload, compact=True))
    text = answered(lambda send: send_text(send, 200, "é"))
    assert plain[1]["body"] == json.dumps(payload).encode() == b'{"a": [1, 2], "b": "\\u00e9"}'
    assert compact[1]["body"] == b'{"a":[1,2],"b":"\\u00e9"}'
    assert plain[0]["headers"][0] == (b"content-type", b"application/json")
    assert text[0]["headers"][:2] == [(b"content-type", b"text/plain"), (b"content-length", b"2")]
    assert text[1]["body"] == "é".encode()


# --- each app's answer ---------------------------------------------------------------------------


def metadata_body(receive) -> bytes:
    request = metadata._Request({"headers": [], "query_string": b""}, receive)
    return run_in_new_loop(request.body)


def test_metadata_cuts_a_long_body_at_its_limit_and_reads_a_gone_guest_as_empty():
    limit = metadata.BODY_LIMIT
    long = client_sending(chunk(b"x" * (limit - 1), more=True), chunk(b"yz", more=True))
    assert metadata_body(long) == b"x" * (limit - 1) + b"y"
    assert metadata_body(client_sending(chunk(b"{}", more=True))) == b""
    assert metadata_body(client_sending(chunk(b"{}"))) == b"{}"


def test_router_refuses_a_gone_client_with_400_and_a_long_body_with_413():
    with pytest.raises(router.Refusal) as gone:
        run_in_new_loop(lambda: router._body(client_sending()))
    assert (gone.value.status, str(gone.value)) == (
        400,
        "The client went away before sending its request.",
    )
    long = client_sending(chunk(b"x" * (router.BODY_LIMIT + 1)))
    with pytest.raises(router.Refusal) as too_large:
        run_in_new_loop(lambda: router._body(long))
    assert (too_large.value.status, str(too_large.value)) == (
        413,
        "The request body is over 8 MiB.",
    )


def test_model_simulator_refuses_a_gone_client_with_400_and_a_long_body_with_413():
    with pytest.raises(model_simulator.SimulatorError) as gone:
        run_in_new_loop(lambda: model_simulator._payload(client_sending()))
    assert (gone.value.status, str(gone.value)) == (
        400,
        "the client went away before sending its request",
    )
    long = client_sending(chunk(b"x" * (model_simulator.BODY_LIMIT + 1)))
    with pytest.raises(model_simulator.SimulatorError) as too_large:
        run_in_new_loop(lambda: model_simulator._payload(long))
    assert (too_large.value.status, str(too_large.value)) == (
        413,
        "the request body is over 8192 KiB",
    )
