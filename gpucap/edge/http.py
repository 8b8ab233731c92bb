"""A request's body in, a whole answer out, for the raw ASGI apps in front of Django.

Reading raises a small exception when the body cannot be had (``ClientGone``,
``BodyTooLarge``): each app answers it in its own wire format, with its own status and words.
Sending takes what differs between the apps as parameters (extra headers, compact JSON), so
each answers byte for byte what it always has.

``answer_or_500`` runs an app so that an exception nobody handled is still an answer: a 500
in the app's own JSON shape with a request id, the traceback logged under the same id.
"""

import json
import logging
import uuid
from collections.abc import Callable

logger = logging.getLogger(__name__)

# The model simulator answers as a model server does: JSON without spaces.
_COMPACT = (",", ":")


class ClientGone(Exception):
    """The client went away before it sent its whole request."""


class BodyTooLarge(Exception):
    """The body goes past ``limit`` bytes; reading stopped at the message that took it there."""

    def __init__(self, limit: int, chunks: list[bytes]) -> None:
        super().__init__(f"the request body is over {limit} bytes")
        self.limit = limit
        self._chunks = chunks

    @property
    def received(self) -> bytes:
        """What was read, up to and including that message (joined only when asked for)."""
        return b"".join(self._chunks)


async def read_body(receive, *, limit: int) -> bytes:
    """The request's whole body, at most ``limit`` bytes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            raise BodyTooLarge(limit, chunks)
        if not message.get("more_body"):
            # Most bodies come in one message: no copy then.
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_text(send, status: int, text: str, *, headers=()) -> None:
    await send_body(send, status, text.encode(), content_type=b"text/plain", headers=headers)


async def send_json(send, status: int, payload, *, compact: bool = False, headers=()) -> None:
    body = json.dumps(payload, separators=_COMPACT if compact else None).encode()
    await send_body(send, status, body, content_type=b"application/json", headers=headers)


async def send_body(send, status: int, body: bytes, *, content_type: bytes, headers=()) -> None:
    """The whole answer in one message, its length given; ``headers`` follow the two."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def answer_or_500(app, scope, receive, send, *, body: Callable[[str], dict]) -> None:
    """``await app(scope, receive, send)``; if it raises before its answer started, a 500 whose
    JSON is ``body(request_id)``, the request id also in ``X-Request-Id`` and in the log with
    the traceback. (Once the answer started, only closing the connection is left.)"""
    started = False

    async def send_tracked(message) -> None:
        nonlocal started
        if message["type"] == "http.response.start":
            started = True
        await send(message)

    try:
        await app(scope, receive, send_tracked)
    except Exception:
        request_id = uuid.uuid4().hex
        logger.exception(
            "unhandled error in %s %s (request id %s)",
            scope.get("method"),
            scope.get("path"),
            request_id,
        )
        if started:
            raise
        headers = [(b"x-request-id", request_id.encode())]
        await send_json(send, 500, body(request_id), headers=headers)
