"""The model server of the simulated driver's inference replicas: a small OpenAI-compatible
model simulator (DESIGN.md section 10), so a deployment, its router and the official ``openai``
client work end to end on a laptop with no GPU.

This app serves it (gpucap/asgi.py) at the endpoint the simulated driver reports for each
replica, ``SIMULATOR_BASE_URL/simulated/replicas/<instance id>``:

- ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``; with
  ``"stream": true`` the answer comes as server-sent events in OpenAI's chunk format
  (``chat.completion.chunk`` / ``text_completion``), ending with ``data: [DONE]``.
- The text is a function of the prompt: the same prompt always gets the same words (seeded by
  its SHA-256), one word per token, at most ``max_tokens`` (or ``max_completion_tokens``) of
  them, 16 when unsaid. ``usage`` counts prompt words and answer tokens.
- Latency: ``SIMULATOR_TTFT_MS`` before the first token, then ``SIMULATOR_TOKENS_PER_SECOND``
  (0: every token at once). Headers ``X-Simulator-TTFT-Ms`` and
  ``X-Simulator-Tokens-Per-Second`` override them for one request (the router passes them on;
  tests use them to keep a replica busy). A request's delays add up to at most
  ``SIMULATOR_MAX_DELAY_SECONDS``: a longer time to first token is refused (400), and the
  tokens after it come faster where they would run past it, so no request holds a connection
  longer than that.
- It answers anyone: gpucap/asgi.py mounts it only when ``SIMULATOR_ENABLED`` is set.
- A replica whose model server was killed (``SimulatedDriver.replica_kill``) fails as a crashed
  server does: its connections close without a byte of answer. One Redis read per request
  finds that out.

``served`` counts the requests each replica answered in this process.
"""

import asyncio
import hashlib
import json
import secrets
import time
from collections import Counter

import redis.asyncio as aioredis
from django.conf import settings

from gpucap.drivers.simulated import replica_dead_key
from gpucap.edge.http import BodyTooLarge, ClientGone, read_body, send_json
from gpucap.edge.loops import PerLoop
from gpucap.redis_clients import async_redis

PREFIX = "/simulated/replicas/"
MODEL = "gpucap-simulator"
DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 4096
BODY_LIMIT = 8 * 1024 * 1024
# A few dozen common words: the simulated model's whole vocabulary.
_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "so no what up out more about into them can only other time new some could these two may "
    "first then do any like my now over such our man me even most made after also did many"
)
VOCABULARY = tuple(_WORDS.split())

served: Counter = Counter()


class SimulatorError(Exception):
    """A request the simulated model refuses, with OpenAI's error shape."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


class ReplicaDead(Exception):
    """Raised where the server gives no way to drop the connection (it then answers 500)."""


async def model_simulator_app(scope, receive, send) -> None:
    instance_id, _, rest = scope["path"][len(PREFIX) :].partition("/")
    if await _dead(instance_id):
        await _drop_connection(receive, send, instance_id)
        return
    headers = dict(scope["headers"])
    try:
        methods = _ROUTES.get(f"/{rest}") if instance_id else None
        if methods is None:
            raise SimulatorError(404, f"Unknown request URL: {scope['method']} /{rest}")
        handler = methods.get(scope["method"])
        if handler is None:
            raise SimulatorError(405, f"{scope['method']} is not allowed here")
        await handler(instance_id, headers, receive, send)
    except SimulatorError as error:
        await _json(send, error.status, _error_body(error))


# --- the OpenAI surface ---------------------------------------------------------------------------


async def models(instance_id, headers, receive, send) -> None:
    await _json(
        send,
        200,
        {
            "object": "list",
            "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "gpucap"}],
        },
    )


async def chat_completions(instance_id, headers, receive, send) -> None:
    payload = await _payload(receive)
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise SimulatorError(400, "messages: must be a non-empty list", param="messages")
    await _complete(instance_id, headers, send, payload, chat_prompt(messages), chat=True)


async def completions(instance_id, headers, receive, send) -> None:
    payload = await _payload(receive)
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise SimulatorError(
            400, "prompt: must be a string (the simulator answers one prompt)", param="prompt"
        )
    await _complete(instance_id, headers, send, payload, prompt, chat=False)


_ROUTES = {
    "/v1/models": {"GET": models},
    "/v1/chat/completions": {"POST": chat_completions},
    "/v1/completions": {"POST": completions},
}


# --- the simulated model -------------------------------------------------------------------------


def answer(prompt: str, max_tokens: int) -> tuple[list[str], str]:
    """The tokens the simulated model answers ``prompt`` with, and why it stopped (``stop``: it
    said all it had, ``length``: ``max_tokens`` cut it short). Same prompt, same answer."""
    seed = hashlib.sha256(prompt.encode()).digest()
    natural = 8 + seed[0] % 57  # 8..64 words when nothing cuts it short
    count = min(natural, max_tokens)
    words: list[str] = []
    block = seed
    while len(words) < count:
        block = hashlib.sha256(block).digest()
        words.extend(VOCABULARY[byte % len(VOCABULARY)] for byte in block)
    tokens = [word if n == 0 else f" {word}" for n, word in enumerate(words[:count])]
    if tokens:
        tokens[0] = tokens[0].capitalize()
    finish = "stop" if natural <= max_tokens else "length"
    if tokens and finish == "stop":
        tokens[-1] += "."
    return tokens, finish


def chat_prompt(messages: list) -> str:
    """The conversation as one text: what the answer is a function of."""
    lines = []
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise SimulatorError(
                400, f"messages[{n}]: must be an object with a role", param=f"messages[{n}]"
            )
        content = message.get("content")
        if isinstance(content, list):  # content parts: the text ones count
            content = " ".join(
                part.get("text", "")
                for part in content
                if isinstance(part, dict) and part.get("type") == "text"
            )
        lines.append(f"{message['role']}: {content or ''}")
    return "\n".join(lines)


async def _complete(instance_id, headers, send, payload, prompt, *, chat: bool) -> None:
    max_tokens = _max_tokens(payload)
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise SimulatorError(400, "stream: must be true or false", param="stream")
    tokens, finish = answer(prompt, max_tokens)
    ttft, interval = delays(headers, len(tokens))
    model = payload.get("model") if isinstance(payload.get("model"), str) else MODEL
    usage = {
        "prompt_tokens": len(prompt.split()),
        "completion_tokens": len(tokens),
        "total_tokens": len(prompt.split()) + len(tokens),
    }
    response_id = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}"
    created = int(time.time())
    served[instance_id] += 1
    if stream:
        options = payload.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        chunk = _Chunks(response_id, created, model, chat=chat, include_usage=include_usage)
        await _stream(send, chunk, tokens, finish, usage, ttft, interval)
        return
    if ttft or interval:
        await asyncio.sleep(ttft + interval * max(len(tokens) - 1, 0))
    text = "".join(tokens)
    if chat:
        body = {
            "id": response_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": usage,
        }
    else:
        body = {
            "id": response_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
            "usage": usage,
        }
    await _json(send, 200, body)


class _Chunks:
    """OpenAI's streaming chunks for one response."""

    def __init__(self, response_id, created, model, *, chat: bool, include_usage: bool) -> None:
        self.base = {
            "id": response_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
        }
        self.chat = chat
        self.include_usage = include_usage

    def first(self) -> bytes | None:
        """Chat streams open with the assistant's role."""
        if not self.chat:
            return None
        return self._choice({"delta": {"role": "assistant", "content": ""}}, None)

    def token(self, text: str) -> bytes:
        if self.chat:
            return self._choice({"delta": {"content": text}}, None)
        return self._choice({"text": text}, None)

    def last(self, finish: str) -> bytes:
        return self._choice({"delta": {}} if self.chat else {"text": ""}, finish)

    def usage(self, usage: dict) -> bytes:
        return _event({**self.base, "choices": [], "usage": usage})

    def _choice(self, fields: dict, finish: str | None) -> bytes:
        choice = {"index": 0, **fields, "logprobs": None, "finish_reason": finish}
        chunk = {**self.base, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        return _event(chunk)


async def _stream(send, chunks: _Chunks, tokens, finish, usage, ttft, interval) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"),
            ],
        }
    )
    if ttft:
        await asyncio.sleep(ttft)
    first = chunks.first()
    if first is not None:
        await _more(send, first)
    for n, token in enumerate(tokens):
        if n and interval:
            await asyncio.sleep(interval)
        await _more(send, chunks.token(token))
    await _more(send, chunks.last(finish))
    if chunks.include_usage:
        await _more(send, chunks.usage(usage))
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def _event(chunk: dict) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


async def _more(send, body: bytes) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": True})


# --- request details ---------------------------------------------------------------------------


async def _payload(receive) -> dict:
    try:
        body = await read_body(receive, limit=BODY_LIMIT)
    except ClientGone:
        raise SimulatorError(400, "the client went away before sending its request") from None
    except BodyTooLarge:
        raise SimulatorError(413, f"the request body is over {BODY_LIMIT // 1024} KiB") from None
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise SimulatorError(400, "the request body must be JSON") from None
    if not isinstance(payload, dict):
        raise SimulatorError(400, "the request body must be a JSON object")
    return payload


def _max_tokens(payload: dict) -> int:
    for field in ("max_completion_tokens", "max_tokens"):
        value = payload.get(field)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise SimulatorError(400, f"{field}: must be a whole number, 0 or more", param=field)
        return min(value, MAX_TOKENS_LIMIT)
    return DEFAULT_MAX_TOKENS


def delays(headers: dict, tokens: int) -> tuple[float, float]:
    """(seconds to the first token, seconds between tokens) for an answer of ``tokens`` tokens,
    together at most ``SIMULATOR_MAX_DELAY_SECONDS``."""
    cap = settings.SIMULATOR_MAX_DELAY_SECONDS
    ttft_ms = _number(headers, b"x-simulator-ttft-ms", settings.SIMULATOR_TTFT_MS, 1000 * cap)
    rate = _number(
        headers, b"x-simulator-tokens-per-second", settings.SIMULATOR_TOKENS_PER_SECOND, None
    )
    ttft = ttft_ms / 1000
    interval = 1 / rate if rate else 0.0
    if tokens > 1:
        interval = min(interval, (cap - ttft) / (tokens - 1))
    return ttft, interval


def _number(headers: dict, name: bytes, default: float, most: float | None) -> float:
    raw = headers.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise SimulatorError(400, f"{name.decode()}: must be a number, 0 or more")
    if most is not None and value > most:
        raise SimulatorError(
            400,
            f"{name.decode()}: must be at most {most:g} "
            f"(SIMULATOR_MAX_DELAY_SECONDS is {settings.SIMULATOR_MAX_DELAY_SECONDS})",
        )
    return value


# --- a dead replica ------------------------------------------------------------------------------


async def _dead(instance_id: str) -> bool:
    namespace = settings.DATABASES["default"]["NAME"]
    return bool(await _redis.get().exists(replica_dead_key(namespace, instance_id)))


async def _drop_connection(receive, send, instance_id: str) -> None:
    """Close the connection without a byte of answer, as a crashed model server's does.

    ASGI has no message for that, and an exception before ``http.response.start`` makes the
    server answer 500, so the transport is aborted directly: uvicorn hands every request its
    protocol cycle's bound ``send``, which holds the connection's transport. Waiting for the
    disconnect then keeps uvicorn from writing a 500 of its own."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        raise ReplicaDead(f"the model server of {instance_id} is dead")
    transport.abort()
    while (await receive())["type"] != "http.disconnect":
        pass


# --- plumbing ------------------------------------------------------------------------------------


def _error_body(error: SimulatorError) -> dict:
    kind = "invalid_request_error" if error.status < 500 else "server_error"
    return {"error": {"message": str(error), "type": kind, "param": error.param, "code": None}}


async def _json(send, status: int, payload: dict) -> None:
    # Compact, as its streamed chunks are (_event).
    await send_json(send, status, payload, compact=True)


_redis: PerLoop[aioredis.Redis] = PerLoop(lambda: async_redis(settings.REDIS_URL))
