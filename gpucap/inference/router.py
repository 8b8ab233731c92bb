"""The inference router: every deployment's OpenAI-compatible surface (DESIGN.md section 6) at
``/inference/<slug>/v1/``, so the official ``openai`` client works with ``base_url`` and
``api_key``: ``GET /v1/models`` (answered here), ``POST /v1/chat/completions`` and ``POST
/v1/completions`` (forwarded to a replica; ``"stream": true`` answers pass through chunk by
chunk as server-sent events).

It is on the path of every token, so it is a raw ASGI app in front of Django (gpucap/asgi.py)
that reads Redis only, never the ORM (the documents gpucap.inference.cache keeps):

1. One MGET reads the deployment's route document and the API key's document. The key must
   parse, match its salted digest (in constant time), be neither revoked nor expired, belong to
   the deployment's tenant and open this deployment; otherwise 401, and no replica hears of it.
2. One Lua script picks, among the running replicas the route document lists (a replica under
   notice or stopping is not listed), the one with the fewest requests in flight below
   ``replica_concurrency``, and counts the request in. In-flight and queued counts live in
   Redis, shared by every router process. When every replica is full the request waits in the
   queue, up to ``queue_limit`` waiting; beyond that the answer is 429 with ``Retry-After``.
   The same script counts the request in this second's requests.
3. The request goes to the replica over a kept-alive HTTP/1.1 connection, and the answer comes
   back chunk by chunk as it arrives. A connection that fails before anything reached the
   client marks that replica failing for a few seconds and the request goes to another.
4. One more command gives the slot back (and, once a second, records the key's last use),
   whether the request ended well, badly or with the client gone; a client that leaves stops
   its request, queued or streaming.

Each process sends its Redis commands over one connection, pipelined across requests, and
keeps its connections to replicas: see the two sections at the end for why not redis-py's
asyncio client and a general-purpose HTTP client (``bench/router_overhead.py`` measures).

Errors have OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``), so clients
raise their usual exceptions.
"""

import asyncio
import hashlib
import itertools
import json
import logging
import ssl as ssl_module
import time
import weakref
from collections import deque
from functools import lru_cache
from typing import NamedTuple
from urllib.parse import quote, urlsplit

import httptools
from django.conf import settings
from redis.connection import SSLConnection
from redis.connection import parse_url as redis_parse_url

from gpucap.inference import cache
from gpucap.inference.keys import key_matches, key_parse

PREFIX = "/inference/"
BODY_LIMIT = 8 * 1024 * 1024
ATTEMPTS = 3  # replicas tried for one request when connections fail
FAILING_SECONDS = 5  # a replica whose connection failed is avoided this long
QUEUE_WAIT_SECONDS = 60  # a queued request gives up after this long (503)
QUEUE_POLL_SECONDS = (0.002, 0.02)  # a queued request looks for a free slot this often
RETRY_AFTER_SECONDS = 1
REQUESTS_TTL_SECONDS = 120  # per-second request counters outlive every window that reads them
WATCH_AFTER_SECONDS = 0.05  # a request still running after this listens for its client leaving
USED_TTL_SECONDS = 30 * 86400
USED_WRITE_SECONDS = 1  # a key's last use is written at most this often per process
CONNECT_TIMEOUT_SECONDS = 3
# Replicas (uvicorn, vLLM) close idle connections after 5 s: reuse them for less than that.
KEEPALIVE_SECONDS = 4

log = logging.getLogger(__name__)
_turns = itertools.count()

# Hop-by-hop headers, and what is the router's business only, stay here.
_REQUEST_SKIP = frozenset(
    {
        b"host",
        b"authorization",
        b"content-length",
        b"connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"cookie",
        b"accept-encoding",
    }
)
_RESPONSE_SKIP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"date",
        b"server",
    }
)


async def router_app(scope, receive, send) -> None:
    slug, _, rest = scope["path"][len(PREFIX) :].partition("/")
    rest = f"/{rest}"
    authorization = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
            break
    try:
        prefix, secret = _bearer(authorization)
        raw_route, raw_key = await _redis().execute(
            b"MGET", cache.route_key(slug), cache.api_key_key(prefix)
        )
        route = _document(raw_route)
        _key_check(_document(raw_key), secret, slug, route)
        handler = _handler(scope["method"], rest)
        await handler(scope, receive, send, route, rest, prefix)
    except Refusal as refusal:
        await _json(send, refusal.status, refusal.body(), headers=refusal.headers)
    except RedisUnavailable as error:
        log.error("inference router: %s", error)
        unavailable = Refusal(
            503,
            "The router cannot reach its store; retry shortly.",
            kind="server_error",
            code="router_unavailable",
        )
        await _json(send, 503, unavailable.body(), headers=_retry_after())


# --- who is asking -------------------------------------------------------------------------------


class Refusal(Exception):
    """An answer that is an OpenAI-style error."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: tuple = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.code = code
        self.param = param
        self.headers = headers

    def body(self) -> dict:
        error = {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}
        return {"error": error}


def _unauthorized(message: str) -> Refusal:
    challenge = ((b"www-authenticate", b"Bearer"),)
    return Refusal(401, message, code="invalid_api_key", headers=challenge)


def _bearer(authorization: str | None) -> tuple[str, str]:
    """(prefix, secret) of the request's API key."""
    scheme, _, key = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise _unauthorized(
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    parsed = key_parse(key.strip())
    if parsed is None:
        raise _unauthorized(
            "Incorrect API key provided: it is not a gpucap key (they read gpk_<prefix>_<secret>)."
        )
    return parsed


def _key_check(key: dict | None, secret: str, slug: str, route: dict | None) -> None:
    """Refuse unless the key is genuine, current and opens this deployment. A deployment that
    does not exist is refused like another tenant's: a key tells nothing about other tenants."""
    if key is None or not key_matches(salt=key["salt"], digest=key["digest"], secret=secret):
        raise _unauthorized("Incorrect API key provided.")
    if key["revoked"]:
        raise _unauthorized("This API key has been revoked.")
    expires_at = key["expires_at"]
    if expires_at is not None and expires_at <= time.time():
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires_at))
        raise _unauthorized(f"This API key expired at {when}.")
    opens = key["deployment"] in (None, slug)
    if route is None or route["tenant"] != key["tenant"] or not opens:
        raise _unauthorized(f"This API key does not open the deployment at {PREFIX}{slug}/.")


def _handler(method: str, rest: str):
    methods = _ROUTES.get(rest)
    if methods is None and rest.startswith("/v1/models/"):
        methods = {"GET": model_retrieve}
    if methods is None:
        raise Refusal(404, f"Unknown request URL: {method} {rest}.", code="unknown_url")
    handler = methods.get(method)
    if handler is None:
        raise Refusal(
            405,
            f"Method {method} is not allowed for {rest}; use {', '.join(methods)}.",
            code="method_not_allowed",
        )
    return handler


# --- models --------------------------------------------------------------------------------------


async def models_list(scope, receive, send, route, rest, prefix) -> None:
    await _json(send, 200, {"object": "list", "data": [_model(route)]})
    await _key_used(prefix)


async def model_retrieve(scope, receive, send, route, rest, prefix) -> None:
    asked = rest.removeprefix("/v1/models/")
    if asked != route["model"] and asked != quote(route["model"], safe=""):
        raise _model_not_found(asked)
    await _json(send, 200, _model(route))
    await _key_used(prefix)


def _model(route: dict) -> dict:
    return {
        "id": route["model"],
        "object": "model",
        "created": route.get("created", 0),
        "owned_by": route["tenant"],
    }


def _model_not_found(model: str) -> Refusal:
    return Refusal(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        code="model_not_found",
        param="model",
    )


# --- completions ---------------------------------------------------------------------------------


async def completion(scope, receive, send, route, rest, prefix) -> None:
    """Check the request, then hold a replica slot for it while it is answered (or queued),
    for as long as the client stays."""
    body = await _body(receive)
    _payload_check(body, route, chat=rest == "/v1/chat/completions")
    if not route["replicas"]:
        raise _no_replica(route["slug"])
    exchange = _Exchange(scope, send, route, rest, body)
    task = asyncio.current_task()
    # The body is read: the next message from the client is its disconnect. A request still
    # running after a moment (queued, or a long answer) listens for it, and stops when it
    # comes before the answer is out: it leaves the queue, or closes the replica's stream.
    watch = _DisconnectWatch(receive, exchange, task)
    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_SECONDS, watch.start)
    try:
        await exchange.run()
    except asyncio.CancelledError:
        if not exchange.left:
            raise  # not ours: the server is shutting down
        task.uncancel()
    finally:
        exchange.over = True
        timer.cancel()
        watch.stop()
        # The answer is out (or the client gone): the slot goes back without waiting here.
        _logged(exchange.finish(prefix))


class _DisconnectWatch:
    def __init__(self, receive, exchange: "_Exchange", task: asyncio.Task) -> None:
        self.receive = receive
        self.exchange = exchange
        self.task = task
        self.gone: asyncio.Future | None = None

    def start(self) -> None:
        self.gone = asyncio.ensure_future(self.receive())
        self.gone.add_done_callback(lambda _: self.exchange.client_gone(self.task))

    def stop(self) -> None:
        if self.gone is not None:
            self.gone.cancel()


def _payload_check(body: bytes, route: dict, *, chat: bool) -> None:
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise Refusal(400, f"The request body is not valid JSON: {error}.") from None
    if not isinstance(payload, dict):
        raise Refusal(400, "The request body must be a JSON object.")
    model = payload.get("model")
    if model is not None and model != route["model"]:
        if not isinstance(model, str):
            raise Refusal(400, "model: must be a string.", param="model")
        raise _model_not_found(model)
    if not isinstance(payload.get("stream", False), bool):
        raise Refusal(400, "stream: must be true or false.", param="stream")
    if chat:
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Refusal(
                400, "messages: a non-empty list of messages is required.", param="messages"
            )
    elif payload.get("prompt") is None:
        raise Refusal(400, "prompt: is required.", param="prompt")


class _Exchange:
    """One completion request: the replica slot it holds, its place in the queue, its answer."""

    def __init__(self, scope, send, route: dict, rest: str, body: bytes) -> None:
        self.scope = scope
        self.send = send
        self.route = route
        self.slug = route["slug"]
        self.rest = rest
        self.body = body
        self.replica: str | None = None  # the slot held
        self.queued = False  # counted in the deployment's queue
        self.answered = False  # the client has its whole answer
        self.left = False  # the client went away first
        self.over = False
        self._step: asyncio.Future | None = None  # the last acquire's reply

    def client_gone(self, task: asyncio.Task) -> None:
        if not (self.over or self.answered):
            self.left = True
            task.cancel()

    async def run(self) -> None:
        tried: list[str] = []
        failure = None
        for _ in range(ATTEMPTS):
            replica = await self._acquire(tried)
            url = next(r["url"] for r in self.route["replicas"] if r["id"] == replica)
            try:
                connection = await _pool().exchange(url, self._request_head(url), self.body)
            except ReplicaFailed as error:
                log.warning("replica %s of %s failed: %s", replica, self.slug, error)
                failure = error
                tried.append(replica)
                await asyncio.shield(self._release_failing())
                continue
            try:
                await self._relay(connection, replica)
            finally:
                _pool().give_back(connection)
            return
        raise Refusal(
            502,
            f"The replicas of {self.slug} failed to answer ({failure}); retry shortly.",
            kind="server_error",
            code="replica_failed",
            headers=_retry_after(),
        )

    async def _acquire(self, tried: list[str]) -> str:
        """A slot on the least busy replica not tried yet (any, once all were), waiting in the
        queue for one while every replica is full."""
        candidates = self._candidates(tried)
        outcome, waiting = await self._try("new", candidates)
        if outcome == b"full":
            raise Refusal(
                429,
                f"The deployment {self.slug} is at capacity: every replica is busy and "
                f"{waiting} requests are waiting. Retry after {RETRY_AFTER_SECONDS} s.",
                kind="rate_limit_error",
                code="rate_limit_exceeded",
                headers=_retry_after(),
            )
        deadline = time.monotonic() + QUEUE_WAIT_SECONDS
        pause, most = QUEUE_POLL_SECONDS
        while outcome != b"go":
            if time.monotonic() > deadline:
                raise Refusal(
                    503,
                    f"The deployment {self.slug} had no free replica for "
                    f"{QUEUE_WAIT_SECONDS} s; retry shortly.",
                    kind="server_error",
                    code="queue_timeout",
                    headers=_retry_after(),
                )
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, most)
            outcome, _ = await self._try("waiting", candidates)
            if outcome == b"gone":  # its replicas left while it waited: take the new list
                self.route = _document(await _redis().execute(b"GET", cache.route_key(self.slug)))
                if self.route is None or not self.route["replicas"]:
                    raise _no_replica(self.slug)
                candidates = self._candidates(tried)
        return self.replica

    def _candidates(self, tried: list[str]) -> list[str]:
        ids = [replica["id"] for replica in self.route["replicas"]]
        turn = next(_turns) % len(ids)
        ids = ids[turn:] + ids[:turn]  # equally busy replicas take turns
        return [replica for replica in ids if replica not in tried] or ids

    async def _try(self, mode: str, candidates: list[str]) -> tuple[bytes, int]:
        """One run of the acquire script. Its reply is recorded here as it arrives, even if the
        client has left meanwhile; ``finish`` waits for it before giving slots back."""
        now = time.time()
        keys = [
            cache.inflight_key(self.slug),
            cache.queued_key(self.slug),
            cache.route_key(self.slug),
            cache.requests_key(self.slug, int(now)),
            _failing_key(self.slug),
        ]
        limits = [self.route["replica_concurrency"], self.route["queue_limit"]]
        args = [mode, *limits, REQUESTS_TTL_SECONDS, f"{now:.3f}", *candidates]
        reply = _redis().evaluate(_ACQUIRE, keys, args)
        reply.add_done_callback(self._record)
        self._step = reply
        outcome, value = await asyncio.shield(reply)
        self._record(reply)  # done already, unless the reply was in before the callback ran
        return outcome, 0 if outcome == b"go" else int(value)

    def _record(self, reply: asyncio.Future) -> None:
        """Note what the acquire script did (harmless twice)."""
        if reply.cancelled() or reply.exception() is not None:
            return
        outcome, value = reply.result()
        if outcome == b"go":
            self.replica, self.queued = value.decode(), False
        elif outcome == b"queued":
            self.queued = True

    def _request_head(self, url: str) -> bytes:
        """The request line and headers for the replica: the client's own headers, less
        hop-by-hop ones and the router's business (its API key)."""
        target = _target(url)
        path = f"{target.path}{self.rest}"
        query = self.scope["query_string"]
        lines = [
            f"POST {path}?{query.decode('latin-1')}" if query else f"POST {path}",
            " HTTP/1.1\r\nhost: ",
            target.host_header,
            f"\r\ncontent-length: {len(self.body)}\r\naccept-encoding: identity\r\n",
        ]
        head = [line.encode("latin-1") for line in lines]
        for name, value in self.scope["headers"]:
            if name not in _REQUEST_SKIP:
                head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        return b"".join(head)

    async def _relay(self, connection: "_ReplicaConnection", replica: str) -> None:
        headers = [(n, v) for n, v in connection.headers if n not in _RESPONSE_SKIP]
        headers.append((b"x-gpucap-replica", replica.encode()))
        start = {"type": "http.response.start", "status": connection.status, "headers": headers}
        started = False
        try:
            last = False
            while not last:
                chunk, last = await connection.chunk()
                if not started:
                    # The head waits for the first chunk: a short answer leaves in one go.
                    await self.send(start)
                    started = True
                more = not last
                await self.send({"type": "http.response.body", "body": chunk, "more_body": more})
        except ReplicaFailed as error:
            log.warning("replica %s of %s failed mid-answer: %s", replica, self.slug, error)
            if not started:
                raise Refusal(
                    502,
                    f"The replica {replica} of {self.slug} failed while answering; retry.",
                    kind="server_error",
                    code="replica_failed",
                    headers=_retry_after(),
                ) from None
            # Part of the answer is out: the client must not take it for a whole one.
            _abort(self.send)
            return
        self.answered = True

    def _release_failing(self) -> asyncio.Future:
        """Give the slot back and mark the replica failing for a while."""
        replica, self.replica = self.replica, None
        failing, now = _failing_key(self.slug), time.time()
        return _redis().send(
            (b"HINCRBY", cache.inflight_key(self.slug), replica, -1),
            (b"ZREMRANGEBYSCORE", failing, b"-inf", f"{now:.3f}"),
            (b"ZADD", failing, f"{now + FAILING_SECONDS:.3f}", replica),
            (b"EXPIRE", failing, FAILING_SECONDS * 2),
        )

    def finish(self, prefix: str) -> asyncio.Future | None:
        """Give back what the request holds and count it, in one write. If the last acquire's
        reply is still on its way, once it is in."""
        step = self._step
        if step is not None and not step.done():
            step.add_done_callback(lambda _: _logged(self.finish(prefix)))
            return None
        commands = []
        if self.replica is not None:
            commands.append((b"HINCRBY", cache.inflight_key(self.slug), self.replica, -1))
            self.replica = None
        if self.queued:
            commands.append((b"DECR", cache.queued_key(self.slug)))
            self.queued = False
        now = time.time()
        if now - _used_written.get(prefix, 0.0) >= USED_WRITE_SECONDS:
            _used_written[prefix] = now
            used = f"{now:.3f}"
            commands.append((b"SET", cache.used_key(prefix), used, b"EX", USED_TTL_SECONDS))
        if not commands:
            return None
        return _redis().send(*commands) if len(commands) > 1 else _redis().command(*commands[0])


# When this process last recorded each key's use: ``last_used_at`` needs no finer grain.
_used_written: dict[str, float] = {}


def _logged(future: asyncio.Future | None) -> None:
    """Let ``future`` finish on its own; say so if it fails (a slot may stay counted)."""

    def report(done: asyncio.Future) -> None:
        if not done.cancelled() and done.exception() is not None:
            log.error("inference router: %s; a slot or queue place stays counted", done.exception())

    if future is not None:
        future.add_done_callback(report)


def _failing_key(slug: str) -> str:
    """A sorted set: replica id -> until when (epoch seconds) its connections were failing."""
    return f"{cache.PREFIX}failing:{slug}"


def _retry_after() -> tuple:
    return ((b"retry-after", str(RETRY_AFTER_SECONDS).encode()),)


def _no_replica(slug: str) -> Refusal:
    return Refusal(
        503,
        f"The deployment {slug} has no replica ready yet; retry shortly.",
        kind="server_error",
        code="no_replica_ready",
        headers=_retry_after(),
    )


# Pick the candidate (ARGV[6..]) with the fewest requests in flight below the limit, count the
# request in, and count it in this second's requests (KEYS[4], expiring ARGV[4] seconds after
# it was made). Candidates failing until after now (ARGV[5]; KEYS[5]) are passed over unless
# all are. ARGV[1] "new": a newcomer queues behind those already waiting, or hears "full" past
# the queue limit. "waiting": a queued request takes a free slot or keeps waiting; candidates
# that left the route document (KEYS[3]: notified, stopping) are out, and when none is left the
# answer is "gone".
_ACQUIRE = """
local limit, queue_limit, now = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local waiting = ARGV[1] == 'waiting'
local queued = tonumber(redis.call('GET', KEYS[2]) or '0')
local pick, pick_n, spare, spare_n, healthy, present = nil, 0, nil, 0, false, false
if waiting or queued <= 0 then
  local listed = nil
  if waiting then
    listed = {}
    local doc = redis.call('GET', KEYS[3])
    if doc then
      for _, replica in ipairs(cjson.decode(doc)['replicas']) do listed[replica['id']] = true end
    end
  end
  local candidates = {unpack(ARGV, 6)}
  local counts = redis.call('HMGET', KEYS[1], unpack(candidates))
  local until_ = redis.call('ZMSCORE', KEYS[5], unpack(candidates))
  for i, id in ipairs(candidates) do
    if listed == nil or listed[id] then
      present = true
      local failing = until_[i] and tonumber(until_[i]) > now
      local n = tonumber(counts[i] or '0')
      if not failing then healthy = true end
      if n < limit then
        if not failing then
          if pick == nil or n < pick_n then pick, pick_n = id, n end
        elseif spare == nil or n < spare_n then
          spare, spare_n = id, n
        end
      end
    end
  end
  if pick == nil and not healthy then pick = spare end
end
if pick then
  redis.call('HINCRBY', KEYS[1], pick, 1)
  if waiting then redis.call('DECR', KEYS[2]) end
  if redis.call('INCR', KEYS[4]) == 1 then redis.call('EXPIRE', KEYS[4], ARGV[4]) end
  return {'go', pick}
end
if waiting then
  if not present then return {'gone', queued} end
  return {'queued', queued}
end
if queued >= queue_limit then return {'full', queued} end
redis.call('INCR', KEYS[2])
return {'queued', queued + 1}
"""


# --- plumbing ------------------------------------------------------------------------------------


async def _body(receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise Refusal(400, "The client went away before sending its request.")
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > BODY_LIMIT:
            raise Refusal(413, f"The request body is over {BODY_LIMIT // (1024 * 1024)} MiB.")
        if not message.get("more_body"):
            return b"".join(chunks)


@lru_cache(maxsize=1024)
def _document(raw: bytes | None) -> dict | None:
    """A route or key document. Parsed once per version: the same bytes, the same (shared,
    never changed) dict."""
    return None if raw is None else json.loads(raw)


async def _key_used(prefix: str) -> None:
    now = time.time()
    if now - _used_written.get(prefix, 0.0) >= USED_WRITE_SECONDS:
        _used_written[prefix] = now
        used = f"{now:.3f}"
        await _redis().execute(b"SET", cache.used_key(prefix), used, b"EX", USED_TTL_SECONDS)


async def _json(send, status: int, payload: dict, *, headers=()) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _abort(send) -> None:
    """Close the client's connection mid-answer (uvicorn's cycle holds the transport)."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        raise ConnectionAbortedError("the replica failed mid-answer")
    transport.abort()


# --- connections to replicas ----------------------------------------------------------------------
#
# Replicas speak HTTP/1.1. Each router process keeps idle keep-alive connections per replica
# and parses answers with httptools, the C parser uvicorn itself uses. A general-purpose client
# (httpx2, aiohttp) costs several times the router's whole budget per request in Python and
# sends a request's head and body as separate segments; here a request is one write.


class ReplicaFailed(Exception):
    """The replica's connection failed: refused, reset, closed early, or garbled."""


_HEAD, _END = object(), object()  # events of an answer, between its chunks of body


class _ReplicaConnection(asyncio.Protocol):
    """One connection to a replica, one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.target: tuple | None = None  # the pool's key
        self.closed: asyncio.Future | None = None  # done once the connection is gone
        self.reused = False  # had answered before: a failure may just mean it timed out idle
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._events: deque = deque()
        self._waiter: asyncio.Future | None = None
        self._paused = False
        self._failure: ReplicaFailed | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False  # the whole answer is in
        self.keep_alive = False  # and the connection may carry another
        self._head = False
        self._delimited = False  # the body's end is told (length or chunks), not the close

    @property
    def usable(self) -> bool:
        return (
            self._failure is None
            and self.transport is not None
            and not (self.transport.is_closing())
        )

    def request(self, head: bytes, body: bytes) -> None:
        self._reset()
        self._events.clear()
        self.transport.write(head + body)

    async def response(self) -> None:
        """Wait for the answer's status line and headers (the first event of an answer)."""
        await self._next()

    async def chunk(self) -> tuple[bytes, bool]:
        """The answer's next chunk of body, and whether it is the last (the last may be empty)."""
        item = await self._next()
        if item is _END:
            return b"", True
        if self._events and self._events[0] is _END:
            self._events.popleft()
            return item, True
        return item, False

    def close(self) -> asyncio.Future | None:
        """Close; the future is done once the connection is gone."""
        if self.transport is not None:
            self.transport.close()
        return self.closed

    async def _next(self):
        while not self._events:
            if self._failure is not None:
                raise self._failure
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._events.popleft()
        if self._paused and len(self._events) < 4:
            self._paused = False
            self.transport.resume_reading()
        return item

    def _push(self, item) -> None:
        self._events.append(item)
        if not self._paused and len(self._events) > 64:  # the client reads slower than we get
            self._paused = True
            self.transport.pause_reading()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(f"unparseable answer: {error}")
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set_result(None)
        if self._head and not self.complete and not self._delimited:
            self.complete = True  # the close was the end of the body
            self._push(_END)
        else:
            self._fail(f"connection closed: {exc or 'by the replica'}")

    def _fail(self, message: str) -> None:
        if self._failure is None:
            self._failure = ReplicaFailed(message)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self.headers.append((name, value))
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value):
            self._delimited = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._head = True
        self._push(_HEAD)

    def on_body(self, body: bytes) -> None:
        self._push(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive() and self._delimited
        self._push(_END)


class _ReplicaPool:
    """Idle keep-alive connections per replica address, for one event loop."""

    def __init__(self) -> None:
        self._idle: dict[tuple, list[_ReplicaConnection]] = {}

    async def exchange(self, url: str, head: bytes, body: bytes) -> _ReplicaConnection:
        """Send a request; return the connection once the answer's head is in. A reused
        connection that turns out closed is replaced once: idle connections die quietly."""
        target = _target(url)
        while True:
            connection = await self._connection(target)
            connection.request(head, body)
            try:
                await connection.response()
                return connection
            except ReplicaFailed:
                connection.close()
                if not connection.reused:
                    raise
            except BaseException:
                connection.close()
                raise

    def give_back(self, connection: _ReplicaConnection) -> None:
        """Keep the connection for the next request if its exchange ended cleanly."""
        if connection.complete and connection.keep_alive and connection.usable:
            connection.reused = True
            connection.idle_since = time.monotonic()
            self._idle.setdefault(connection.target, []).append(connection)
        else:
            connection.close()

    async def _connection(self, target: "_Target") -> _ReplicaConnection:
        idle = self._idle.get(target.address)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.usable and now - connection.idle_since < KEEPALIVE_SECONDS:
                return connection
            connection.close()
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    _ReplicaConnection,
                    target.host,
                    target.port,
                    ssl=target.ssl,
                    server_hostname=target.host if target.ssl else None,
                ),
                CONNECT_TIMEOUT_SECONDS,
            )
        except (OSError, TimeoutError) as error:
            raise ReplicaFailed(f"cannot connect to {target.host}:{target.port}: {error}") from None
        connection.target = target.address
        return connection

    def close(self) -> list[asyncio.Future]:
        closing = [connection.close() for idle in self._idle.values() for connection in idle]
        self._idle.clear()
        return [future for future in closing if future is not None]


class _Target(NamedTuple):
    address: tuple  # (scheme, host, port): what a connection is kept for
    host: str
    port: int
    ssl: ssl_module.SSLContext | None
    host_header: str
    path: str


@lru_cache(maxsize=4096)
def _target(url: str) -> _Target:
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    return _Target(
        address=(parts.scheme, parts.hostname, port),
        host=parts.hostname,
        port=port,
        ssl=ssl_module.create_default_context() if secure else None,
        host_header=parts.netloc.rpartition("@")[2],
        path=parts.path.rstrip("/"),
    )


# --- Redis, pipelined -----------------------------------------------------------------------------
#
# Every request makes three round trips to Redis. With one connection per process carrying all
# of them, the commands of every request handled in the same turn of the event loop leave in one
# write, and Redis answers in order, so a reply goes to the oldest waiting command: under load,
# a handful of requests share each system call. (redis-py's asyncio client takes a pooled
# connection, a write and a read per command, with its hooks around each, several times the
# router's budget; it has no automatic pipelining.)


class RedisUnavailable(Exception):
    """The router's Redis cannot be reached."""


class RedisReplyError(Exception):
    """Redis answered a command with an error."""


_INCOMPLETE = object()


class _RedisConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiting: deque[asyncio.Future] = deque()
        self._outgoing: list[bytes] = []
        self._lost: Exception | None = None
        self.closed: asyncio.Future | None = None  # done once the connection is gone

    @property
    def usable(self) -> bool:
        return self._lost is None and self.transport is not None

    def command(self, *args) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if self._lost is not None:
            future.set_exception(RedisUnavailable(str(self._lost)))
            return future
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing.append(_pack(args))
        self._waiting.append(future)
        return future

    def _flush(self) -> None:
        if self._outgoing and self.usable:
            self.transport.write(b"".join(self._outgoing))
        self._outgoing.clear()

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        position = 0
        while self._waiting:
            try:
                parsed = _parse_reply(self._buffer, position)
            except (RedisUnavailable, ValueError) as error:
                self._lost = error  # out of step with Redis: every waiting reply is lost
                self.transport.close()
                return
            if parsed is _INCOMPLETE:
                break
            reply, position = parsed
            future = self._waiting.popleft()
            if future.done():  # its caller stopped waiting; the command happened all the same
                continue
            if isinstance(reply, RedisReplyError):
                future.set_exception(reply)
            else:
                future.set_result(reply)
        del self._buffer[:position]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set_result(None)
        self._lost = exc or ConnectionResetError("Redis closed the connection")
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(RedisUnavailable(str(self._lost)))

    def close(self) -> asyncio.Future | None:
        if self.transport is not None:
            self.transport.close()
        return self.closed


def _replies(futures: list[asyncio.Future]) -> asyncio.Future:
    """One future for the replies of commands sent together. Redis answers in order, so they
    are all in when the last is."""
    replies = futures[-1].get_loop().create_future()

    def settle(_) -> None:
        errors = [f.exception() for f in futures if not f.cancelled() and f.exception()]
        if replies.done():
            return
        if errors:
            replies.set_exception(errors[0])
        elif any(future.cancelled() for future in futures):
            replies.cancel()
        else:
            replies.set_result([future.result() for future in futures])

    futures[-1].add_done_callback(settle)
    return replies


def _pack(args) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if arg.__class__ is not bytes:
            arg = (arg if arg.__class__ is str else str(arg)).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(parts)


def _parse_reply(buffer: bytearray, position: int):
    """One RESP2 reply from ``buffer[position:]`` and where it ends, or _INCOMPLETE."""
    end = buffer.find(b"\r\n", position)
    if end < 0:
        return _INCOMPLETE
    kind, line, after = buffer[position], bytes(buffer[position + 1 : end]), end + 2
    if kind == 0x24:  # $ bulk string
        length = int(line)
        if length < 0:
            return None, after
        if len(buffer) < after + length + 2:
            return _INCOMPLETE
        return bytes(buffer[after : after + length]), after + length + 2
    if kind == 0x3A:  # : integer
        return int(line), after
    if kind == 0x2A:  # * array
        count = int(line)
        if count < 0:
            return None, after
        items = []
        for _ in range(count):
            parsed = _parse_reply(buffer, after)
            if parsed is _INCOMPLETE:
                return _INCOMPLETE
            item, after = parsed
            items.append(item)
        return items, after
    if kind == 0x2B:  # + simple string
        return line, after
    if kind == 0x2D:  # - error
        return RedisReplyError(line.decode(errors="replace")), after
    raise RedisUnavailable(f"unexpected reply from Redis: {bytes(buffer[position:end])!r}")


class _Redis:
    """The commands the router needs, over one pipelined connection (re-made when lost)."""

    def __init__(self, url: str) -> None:
        self._options = parse_redis_url(url)
        self._connection: _RedisConnection | None = None
        self._connecting: asyncio.Future | None = None
        self._scripts: dict[str, str] = {}

    def command(self, *args) -> asyncio.Future:
        """Send one command (in one write with whatever else this turn of the loop sends).
        The future holds its reply; it completes whether or not anyone still waits for it."""
        connection = self._connection
        if connection is None or not connection.usable:
            return asyncio.ensure_future(self._connected_command(args))
        return connection.command(*args)

    def send(self, *commands: tuple) -> asyncio.Future:
        """Several commands: the future holds their replies, or the first error."""
        return _replies([self.command(*command) for command in commands])

    async def execute(self, *args):
        return await self.command(*args)

    def evaluate(self, script: str, keys: list, args: list) -> asyncio.Future:
        """The script's reply, as ``command`` gives it (EVALSHA; EVAL when Redis has not seen
        the script yet)."""
        sha = self._scripts.get(script)
        if sha is None:
            sha = self._scripts[script] = hashlib.sha1(script.encode()).hexdigest()
        call = (len(keys), *keys, *args)
        reply = asyncio.get_running_loop().create_future()

        def settle(sent: asyncio.Future) -> None:
            error = None if sent.cancelled() else sent.exception()
            if isinstance(error, RedisReplyError) and str(error).startswith("NOSCRIPT"):
                self.command(b"EVAL", script, *call).add_done_callback(settle)
            elif not reply.done():
                if error is not None:
                    reply.set_exception(error)
                elif sent.cancelled():
                    reply.cancel()
                else:
                    reply.set_result(sent.result())

        self.command(b"EVALSHA", sha, *call).add_done_callback(settle)
        return reply

    async def _connected_command(self, args: tuple):
        connection = await self._connect()
        return await connection.command(*args)

    async def _connect(self) -> _RedisConnection:
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _open(self) -> _RedisConnection:
        options = self._options
        loop = asyncio.get_running_loop()
        try:
            if options.get("path"):
                _, connection = await asyncio.wait_for(
                    loop.create_unix_connection(_RedisConnection, options["path"]),
                    CONNECT_TIMEOUT_SECONDS,
                )
            else:
                _, connection = await asyncio.wait_for(
                    loop.create_connection(
                        _RedisConnection,
                        options.get("host", "localhost"),
                        options.get("port", 6379),
                        ssl=ssl_module.create_default_context() if options.get("ssl") else None,
                    ),
                    CONNECT_TIMEOUT_SECONDS,
                )
        except (OSError, TimeoutError) as error:
            raise RedisUnavailable(f"cannot connect to Redis: {error}") from None
        setup = []
        if options.get("password"):
            user = [options["username"]] if options.get("username") else []
            setup.append(("AUTH", *user, options["password"]))
        if options.get("db"):
            setup.append(("SELECT", options["db"]))
        for command in setup:
            await connection.command(*command)
        if self._connection is not None:
            self._connection.close()
        self._connection = connection
        return connection

    def close(self) -> list[asyncio.Future]:
        connection, self._connection = self._connection, None
        closing = connection.close() if connection is not None else None
        return [] if closing is None else [closing]


def parse_redis_url(url: str) -> dict:
    options = dict(redis_parse_url(url))
    if options.pop("connection_class", None) is SSLConnection:
        options["ssl"] = True
    return options


class _Clients:
    """A process's Redis connection and its replica connections, for one event loop."""

    def __init__(self) -> None:
        self.redis = _Redis(settings.INFERENCE_REDIS_URL)
        self.replicas = _ReplicaPool()


_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Clients]" = (
    weakref.WeakKeyDictionary()
)


def _clients_here() -> _Clients:
    """One set per event loop (a server process has one; tests start several)."""
    loop = asyncio.get_running_loop()
    clients = _clients.get(loop)
    if clients is None:
        clients = _clients[loop] = _Clients()
    return clients


def _redis() -> _Redis:
    return _clients_here().redis


def _pool() -> _ReplicaPool:
    return _clients_here().replicas


async def clients_close() -> None:
    """At server shutdown: close this event loop's clients."""
    clients = _clients.pop(asyncio.get_running_loop(), None)
    if clients is not None:
        closing = [*clients.replicas.close(), *clients.redis.close()]
        if closing:
            # Let the closes happen while the loop runs: a transport left to the garbage
            # collector after its loop ended may close a file descriptor reused meanwhile.
            await asyncio.wait(closing, timeout=5)


_ROUTES = {
    "/v1/models": {"GET": models_list},
    "/v1/chat/completions": {"POST": completion},
    "/v1/completions": {"POST": completion},
}
