"""The inference router: every deployment's OpenAI-compatible surface (DESIGN.md section 6) at
``/inference/<slug>/v1/``, so the official ``openai`` client works with ``base_url`` and
``api_key``: ``GET /v1/models`` (answered here), ``POST /v1/chat/completions`` and ``POST
/v1/completions`` (forwarded to a replica; ``"stream": true`` answers pass through chunk by
chunk as server-sent events).

It is on the path of every token, so it is a raw ASGI app in front of Django (gpucap/asgi.py)
that reads Redis only, never the ORM (the documents gpucap.inference.cache keeps):

1. The deployment's route document and the API key's document come from this process's copies
   (gpucap.inference.redis_batch: Redis tells the process when one changes, before the write
   that changed it returns) or, the first time, one MGET. The key must parse, match its salted
   digest (in constant time), be neither revoked nor expired, belong to the deployment's tenant
   and open this deployment; otherwise 401, and no replica hears of it.
2. One Lua script picks, among the running replicas the route document lists (a replica under
   notice or stopping is not listed), the one with the fewest requests in flight below
   ``replica_concurrency``, and counts the request in. In-flight and queued counts live in
   Redis, shared by every router process. When every replica is full the request waits in the
   queue, up to ``queue_limit`` waiting; beyond that the answer is 429 with ``Retry-After``.
   With no replica ready (a deployment at zero replicas, or booting) the request queues the
   same way, so it counts as load, and wakes the deployment (``_wake``: the autoscaler decides
   it at once, ``inference.wake``); it waits for the route to list a replica, up to the
   deployment's cold-start timeout, then a 503 ``cold_start_timeout`` with ``Retry-After``.
   The same script counts the request in this second's requests (a request is counted when it
   is sent to a replica).
3. The request goes to the replica over a kept-alive HTTP/1.1 connection
   (gpucap.inference.upstream), and the answer comes back chunk by chunk as it arrives. A
   connection that fails before anything reached the client marks that replica failing for a
   few seconds and the request goes to another.
4. One more command gives the slot back (and, once a second, records the key's last use),
   whether the request ended well, badly or with the client gone; a client that leaves stops
   its request, queued or streaming.

Every answered request is counted in gpucap.metrics (ROUTER_REQUESTS by deployment and status,
ROUTER_LATENCY to the last byte); a client that left before its answer counts as status 499.

Redis commands travel pipelined across requests over one connection per process, and the
packed bytes of a deployment's commands are made once per version of its route document:
``bench/router_overhead.py`` measures what the router costs a request.

Errors have OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``), so clients
raise their usual exceptions.
"""

import asyncio
import hashlib
import itertools
import json
import logging
import time
from functools import lru_cache
from urllib.parse import quote

from asgiref.sync import sync_to_async
from django.conf import settings

from gpucap import inputs
from gpucap.celery import app
from gpucap.edge.http import BodyTooLarge, ClientGone, answer_or_500, read_body, send_json
from gpucap.edge.loops import PerLoop
from gpucap.edge.resync import CLAIM_SECONDS, StoreUnsynced, resync_start
from gpucap.inference import cache
from gpucap.inference.keys import key_matches, key_parse
from gpucap.inference.redis_batch import (
    RedisBatch,
    RedisReplyError,
    RedisUnavailable,
    as_eval,
    bulk,
    pack,
)
from gpucap.inference.upstream import ReplicaConnection, ReplicaFailed, ReplicaPool, replica_target
from gpucap.metrics import ROUTER_LATENCY, ROUTER_REQUESTS

PREFIX = "/inference/"
BODY_LIMIT = 8 * 1024 * 1024
ATTEMPTS = 3  # replicas tried for one request when connections fail
FAILING_SECONDS = 5  # a replica whose connection failed is avoided this long
QUEUE_WAIT_SECONDS = 60  # a queued request gives up after this long (503)
QUEUE_POLL_SECONDS = (0.002, 0.02)  # a queued request looks for a free slot this often
COLD_START_SECONDS = 300  # a route document without its own cold-start timeout waits this long
COLD_START_POLL_SECONDS = 0.2  # a request waiting at zero replicas looks at its route this often
COLD_START_RETRY_MAX_SECONDS = 30  # the Retry-After of a cold-start timeout, at most
WAKE_SECONDS = 2  # a deployment at zero replicas is woken at most this often
RETRY_AFTER_SECONDS = 1
REQUESTS_TTL_SECONDS = cache.REQUESTS_TTL_SECONDS
WATCH_AFTER_SECONDS = 0.05  # a request still running after this listens for its client leaving
USED_TTL_SECONDS = 30 * 86400
USED_WRITE_SECONDS = 1  # a key's last use is written at most this often per process
CLIENT_GONE = 499  # the status counted for a request whose client left before its answer
UNKNOWN_DEPLOYMENT = "unknown"  # the metrics' label for a request that named no deployment

log = logging.getLogger(__name__)
_turns = itertools.count()
_MISSING = object()

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
    """Answer one request; whatever fails unhandled is a 500 in OpenAI's error shape."""
    await answer_or_500(_route, scope, receive, send, body=_server_error_body)


def _server_error_body(request_id: str) -> dict:
    message = f"The router failed to answer (request id {request_id}); retry, or report the id."
    return Refusal(500, message, kind="server_error", code="internal_error").body()


async def _route(scope, receive, send) -> None:
    started = time.perf_counter()
    slug, _, rest = scope["path"][len(PREFIX) :].partition("/")
    rest = f"/{rest}"
    label = UNKNOWN_DEPLOYMENT
    try:
        authorization = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
                break
        prefix, secret = _bearer(authorization)
        clients = _clients.get()
        redis = clients.redis
        route_key, key_key = cache.route_key(slug), cache.api_key_key(prefix)
        route = redis.copies.get(route_key, _MISSING)
        key = redis.copies.get(key_key, _MISSING)
        if route is _MISSING or key is _MISSING:
            route, key = await redis.documents((route_key, key_key), (_route_parse, _key_parse))
        if route is None or key is None:
            await _store_synced(redis)
        _key_check(key, secret, slug, route)
        label = route.slug
        handler = _handler(scope["method"], rest)
        status = await handler(scope, receive, send, route, rest, prefix, clients)
    except Refusal as refusal:
        status = refusal.status
        await send_json(send, refusal.status, refusal.body(), headers=refusal.headers)
    except (RedisUnavailable, StoreUnsynced) as error:
        reason = (
            "cannot reach its store" if isinstance(error, RedisUnavailable) else "is catching up"
        )
        if isinstance(error, RedisUnavailable):
            log.error("inference router: %s", error)
        unavailable = Refusal(
            503,
            f"The router {reason}; retry shortly.",
            kind="server_error",
            code="router_unavailable",
        )
        status = 503
        await send_json(send, 503, unavailable.body(), headers=_retry_after())
    _counted(label, status, time.perf_counter() - started)


async def _store_synced(redis: RedisBatch) -> None:
    """Return if the store holds a full resync; otherwise have it rebuilt and raise
    StoreUnsynced: a document missing from a store that lost its data (Redis restarted empty)
    says nothing about the key or the deployment, and a 401 would be false."""
    if await redis.execute(b"EXISTS", cache.synced_key()):
        return
    claim = (b"SET", cache.resync_claim_key(), b"1", b"NX", b"EX", CLAIM_SECONDS)
    if await redis.execute(*claim) is not None:
        resync_start("inference", cache.inference_resync)
    raise StoreUnsynced


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


@lru_cache(maxsize=1024)
def _bearer(authorization: bytes | None) -> tuple[str, str]:
    """(prefix, secret) of the request's API key (a client sends the same header each time)."""
    scheme, _, key = (authorization or b"").decode("latin-1").strip().partition(" ")
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


def _key_check(key: dict | None, secret: str, slug: str, route: "Route | None") -> None:
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
    if route is None or route.tenant != key["tenant"] or not opens:
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


# --- the documents -------------------------------------------------------------------------------


class Replica:
    """A replica the route document lists, with the bytes the router sends about it."""

    __slots__ = ("id", "release", "request_start", "target", "url")

    def __init__(self, replica_id: str, url: str, inflight_key: str) -> None:
        self.id = replica_id
        self.url = url
        self.target = target = replica_target(url)
        host = f" HTTP/1.1\r\nhost: {target.host_header}\r\n".encode("latin-1")
        self.request_start = (f"POST {target.path}".encode("latin-1"), host)
        self.release = pack((b"HINCRBY", inflight_key, replica_id, b"-1"))


class Route:
    """A deployment's route document, and the packed commands its requests send (made once per
    version of the document)."""

    def __init__(self, document: dict) -> None:
        self.document = document
        self.slug = slug = document["slug"]
        self.model = document["model"]
        self.tenant = document["tenant"]
        self.created = document.get("created", 0)
        self.replica_concurrency = document["replica_concurrency"]
        self.queue_limit = document["queue_limit"]
        self.cold_start_timeout = document.get("cold_start_timeout", COLD_START_SECONDS)
        self.inflight_key = cache.inflight_key(slug)
        self.queued_key = cache.queued_key(slug)
        self.failing_key = cache.failing_key(slug)
        self.replicas = [
            Replica(replica["id"], replica["url"], self.inflight_key)
            for replica in document["replicas"]
        ]
        self.by_id = {replica.id: replica for replica in self.replicas}
        self.dequeue = pack((b"DECR", self.queued_key))
        self._acquire_head = b"".join(
            bulk(part.encode() if isinstance(part, str) else part)
            for part in (
                b"EVALSHA",
                _ACQUIRE_SHA,
                b"5",
                self.inflight_key,
                self.queued_key,
                cache.route_key(slug),
            )
        )
        self._acquire_limits = b"".join(
            bulk(b"%d" % n)
            for n in (self.replica_concurrency, self.queue_limit, REQUESTS_TTL_SECONDS)
        )
        self._failing_bulk = bulk(self.failing_key.encode())
        # Equally busy replicas take turns: the candidates in each rotation, packed.
        ids = [replica.id.encode() for replica in self.replicas]
        self._rotations = [
            b"".join(bulk(i) for i in ids[turn:] + ids[:turn]) for turn in range(len(ids))
        ]
        self._second = -1
        self._requests_bulk = b""

    def acquire(self, mode: bytes, tried: list[str]) -> bytes:
        """The acquire script's call, packed: ``mode`` b"new" or b"waiting"; the candidates
        are the replicas not tried yet (all, once all were), in this request's turn."""
        now = time.time()
        second = int(now)
        if second != self._second:
            self._requests_bulk = bulk(cache.requests_key(self.slug, second).encode())
            self._second = second
        turn = next(_turns) % max(len(self._rotations), 1)
        if not self.replicas:  # at zero: a newcomer queues, a waiting request hears "gone"
            candidates, count = b"", 0
        elif tried:
            ids = [replica.id for replica in self.replicas]
            ids = ids[turn:] + ids[:turn]
            ids = [i for i in ids if i not in tried] or ids
            candidates = b"".join(bulk(i.encode()) for i in ids)
            count = len(ids)
        else:
            candidates, count = self._rotations[turn], len(self.replicas)
        return b"*%d\r\n%b%b%b%b%b%b%b" % (
            13 + count,
            self._acquire_head,
            self._requests_bulk,
            self._failing_bulk,
            bulk(mode),
            self._acquire_limits,
            bulk(b"%.3f" % now),
            candidates,
        )


@lru_cache(maxsize=1024)
def _route_parse(raw: bytes | None) -> Route | None:
    """Parsed once per version: the same bytes, the same (shared, never changed) Route."""
    return None if raw is None else Route(json.loads(raw))


@lru_cache(maxsize=1024)
def _key_parse(raw: bytes | None) -> dict | None:
    return None if raw is None else json.loads(raw)


# --- models --------------------------------------------------------------------------------------


async def models_list(scope, receive, send, route, rest, prefix, clients) -> int:
    await send_json(send, 200, {"object": "list", "data": [_model(route)]})
    _key_used(clients.redis, prefix)
    return 200


async def model_retrieve(scope, receive, send, route, rest, prefix, clients) -> int:
    asked = rest.removeprefix("/v1/models/")
    if asked != route.model and asked != quote(route.model, safe=""):
        raise _model_not_found(asked)
    await send_json(send, 200, _model(route))
    _key_used(clients.redis, prefix)
    return 200


def _model(route: Route) -> dict:
    return {
        "id": route.model,
        "object": "model",
        "created": route.created,
        "owned_by": route.tenant,
    }


def _model_not_found(model: str) -> Refusal:
    return Refusal(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        code="model_not_found",
        param="model",
    )


# --- completions ---------------------------------------------------------------------------------


async def completion(scope, receive, send, route, rest, prefix, clients) -> int:
    """Check the request, then hold a replica slot for it while it is answered (or queued),
    for as long as the client stays."""
    body = await _body(receive)
    _payload_check(body, route, chat=rest == "/v1/chat/completions")
    exchange = _Exchange(scope, receive, send, route, rest, body, clients)
    # The body is read: the next message from the client is its disconnect. A request still
    # running after a moment (queued, or a long answer) listens for it, and stops when it
    # comes before the answer is out: it leaves the queue, or closes the replica's stream.
    clients.watches.add(exchange)
    try:
        await exchange.run()
    except asyncio.CancelledError:
        if not exchange.left:
            raise  # not ours: the server is shutting down
        exchange.task.uncancel()
    finally:
        exchange.over = True
        clients.watches.remove(exchange)
        # The answer is out (or the client gone): the slot goes back without waiting here.
        exchange.finish(prefix)
    return CLIENT_GONE if exchange.left else exchange.status


def _payload_check(body: bytes, route: Route, *, chat: bool) -> None:
    try:
        payload = inputs.json_loads(body)
    except inputs.JsonTooDeep as error:
        raise Refusal(400, f"The request body is {error}.") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise Refusal(400, f"The request body is not valid JSON: {error}.") from None
    if not isinstance(payload, dict):
        raise Refusal(400, "The request body must be a JSON object.")
    model = payload.get("model")
    if model is not None and model != route.model:
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

    def __init__(self, scope, receive, send, route: Route, rest: str, body: bytes, clients):
        self.scope = scope
        self.receive = receive
        self.send = send
        self.route = route
        self.slug = route.slug
        self.rest = rest
        self.body = body
        self.redis: RedisBatch = clients.redis
        self.pool: ReplicaPool = clients.replicas
        self.task = asyncio.current_task()
        self.status = 0  # the answer's, once started
        self.replica: str | None = None  # the slot held
        self.queued = False  # counted in the deployment's queue
        self.answered = False  # the client has its whole answer
        self.left = False  # the client went away first
        self.over = False
        self.gone: asyncio.Future | None = None  # the client's disconnect, once listened for
        self._waiter: asyncio.Future | None = None  # the last acquire's reply, for run()
        self._pending = False  # an acquire's reply is on its way
        self._finish_prefix: str | None = None  # finish() waits for that reply

    # the client leaving

    def watch(self) -> None:
        if not self.over:
            self.gone = asyncio.ensure_future(self.receive())
            self.gone.add_done_callback(self._client_gone)

    def _client_gone(self, _) -> None:
        if not (self.over or self.answered):
            self.left = True
            self.task.cancel()

    # the exchange

    async def run(self) -> None:
        tried: list[str] = []
        failure = None
        for _ in range(ATTEMPTS):
            replica = await self._acquire(tried)
            try:
                connection = await self.pool.exchange(
                    replica.target, self._request_head(replica), self.body
                )
            except ReplicaFailed as error:
                log.warning("replica %s of %s failed: %s", replica.id, self.slug, error)
                failure = error
                tried.append(replica.id)
                await asyncio.shield(self._release_failing())
                continue
            try:
                await self._relay(connection, replica.id)
            finally:
                self.pool.give_back(connection)
            return
        raise Refusal(
            502,
            f"The replicas of {self.slug} failed to answer ({failure}); retry shortly.",
            kind="server_error",
            code="replica_failed",
            headers=_retry_after(),
        )

    async def _acquire(self, tried: list[str]) -> Replica:
        """A slot on the least busy replica not tried yet (any, once all were), waiting in the
        queue for one while every replica is full, or, while none is ready (at zero replicas),
        for one to start: up to the deployment's cold-start timeout."""
        outcome, value = await self._try(b"new", tried)
        if outcome == b"full":
            busy = "every replica is busy" if self.route.replicas else "no replica is ready"
            raise Refusal(
                429,
                f"The deployment {self.slug} is at capacity: {busy} and "
                f"{value} requests are waiting. Retry after {RETRY_AFTER_SECONDS} s.",
                kind="rate_limit_error",
                code="rate_limit_exceeded",
                headers=_retry_after(),
            )
        started, cold = time.monotonic(), False
        pause, most = QUEUE_POLL_SECONDS
        while outcome != b"go":
            if not self.route.replicas:
                # None ready: the queued request is load, and wakes the deployment once; it waits
                # for the route to list a replica (a local copy Redis invalidates: no traffic
                # while it waits). The periodic autoscaler covers a lost wake-up.
                if not cold:
                    cold = True
                    _wake(self.redis, self.slug)
                limit = self.route.cold_start_timeout
            else:  # busy replicas; a request that waited for one to start may wait longer
                limit = max(QUEUE_WAIT_SECONDS, self.route.cold_start_timeout if cold else 0)
            if time.monotonic() - started > limit:
                raise self._timeout(limit)
            if not self.route.replicas:
                await asyncio.sleep(COLD_START_POLL_SECONDS)
                outcome = b"gone"
            else:
                await asyncio.sleep(pause)
                pause = min(pause * 1.5, most)
                outcome, _ = await self._try(b"waiting", tried)
            if outcome == b"gone":  # no replica listed (any more): take the route as it is now
                (route,) = await self.redis.documents(
                    (cache.route_key(self.slug),), (_route_parse,)
                )
                if route is None:  # the deployment is gone
                    raise _no_replica(self.slug)
                self.route = route
        replica = self.route.by_id.get(self.replica)
        if replica is None:  # taken from a newer list than this request's
            (route,) = await self.redis.documents((cache.route_key(self.slug),), (_route_parse,))
            replica = route.by_id[self.replica] if route is not None else None
            if replica is None:
                raise _no_replica(self.slug)
        return replica

    def _timeout(self, waited: float) -> Refusal:
        if self.route.replicas:
            return Refusal(
                503,
                f"The deployment {self.slug} had no free replica for {waited:g} s; retry shortly.",
                kind="server_error",
                code="queue_timeout",
                headers=_retry_after(),
            )
        timeout = self.route.cold_start_timeout
        retry = max(1, min(timeout, COLD_START_RETRY_MAX_SECONDS))
        return Refusal(
            503,
            f"The deployment {self.slug} has no replica ready: none started within its "
            f"cold-start timeout of {timeout} s. One is on its way; retry after {retry} s.",
            kind="server_error",
            code="cold_start_timeout",
            headers=((b"retry-after", str(retry).encode()),),
        )

    def _try(self, mode: bytes, tried: list[str]) -> asyncio.Future:
        """One run of the acquire script. Its reply is recorded as it arrives, even if the
        client has left meanwhile; ``finish`` waits for it before giving slots back."""
        self._waiter = asyncio.get_running_loop().create_future()
        self._pending = True
        self._packed = self.route.acquire(mode, tried)
        self.redis.call(self._packed, self._acquired)
        return self._waiter

    def _acquired(self, reply) -> None:
        """The acquire script's reply (every one, waited for or not)."""
        if isinstance(reply, RedisReplyError) and str(reply).startswith("NOSCRIPT"):
            self.redis.call(as_eval(self._packed, _ACQUIRE), self._acquired)
            return
        self._pending = False
        waiter = self._waiter
        if isinstance(reply, Exception):
            if not waiter.done():
                waiter.set_exception(reply)
        else:
            outcome, value = reply
            if outcome == b"go":
                self.replica, self.queued = value.decode(), False
                value = 0
            elif outcome == b"queued":
                self.queued = True
            if not waiter.done():
                waiter.set_result((outcome, value))
        if self._finish_prefix is not None:
            self.finish(self._finish_prefix)

    def _request_head(self, replica: Replica) -> bytes:
        """The request line and headers for the replica: the client's own headers, less
        hop-by-hop ones and the router's business (its API key)."""
        path, host = replica.request_start
        query = self.scope["query_string"]
        head = [
            path,
            self.rest.encode("latin-1"),
            b"?" + query if query else b"",
            host,
            b"content-length: %d\r\naccept-encoding: identity\r\n" % len(self.body),
        ]
        for name, value in self.scope["headers"]:
            if name not in _REQUEST_SKIP:
                head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        return b"".join(head)

    async def _relay(self, connection: ReplicaConnection, replica: str) -> None:
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
                    self.status = connection.status
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
        failing, now = self.route.failing_key, time.time()
        return self.redis.send(
            (b"HINCRBY", self.route.inflight_key, replica, -1),
            (b"ZREMRANGEBYSCORE", failing, b"-inf", f"{now:.3f}"),
            (b"ZADD", failing, f"{now + FAILING_SECONDS:.3f}", replica),
            (b"EXPIRE", failing, FAILING_SECONDS * 2),
        )

    def finish(self, prefix: str) -> None:
        """Give back what the request holds (in the next write to Redis). If the last
        acquire's reply is still on its way, once it is in."""
        if self._pending:
            self._finish_prefix = prefix
            return
        self._finish_prefix = None
        redis = self.redis
        if self.replica is not None:
            release = self.route.by_id.get(self.replica)
            if release is not None:
                redis.call(release.release, _released)
            else:
                packed = pack((b"HINCRBY", self.route.inflight_key, self.replica, b"-1"))
                redis.call(packed, _released)
            self.replica = None
        if self.queued:
            redis.call(self.route.dequeue, _released)
            self.queued = False
        _key_used(redis, prefix)


# When this process last woke each deployment (monotonic seconds).
_woken: dict[str, float] = {}
# The wake-ups being sent from a thread (kept so none is collected before it ran).
_waking: set[asyncio.Future] = set()


def _wake(redis: RedisBatch, slug: str) -> None:
    """Have the autoscaler look at a deployment with requests waiting and no replica ready,
    now rather than at its next periodic run: at most once per WAKE_SECONDS per process, and
    across the fleet only by the process whose claim (``SET NX EX``) won. The periodic run
    catches up if the message is lost, since the waiting requests count in the queue."""
    now = time.monotonic()
    if now - _woken.get(slug, -WAKE_SECONDS) < WAKE_SECONDS:
        return
    _woken[slug] = now
    claim = (b"SET", cache.wake_key(slug), b"1", b"NX", b"EX", b"%d" % WAKE_SECONDS)
    redis.call(pack(claim), lambda reply: _wake_claimed(reply, slug))


def _wake_claimed(reply, slug: str) -> None:
    if isinstance(reply, Exception):
        log.error("inference router: %s; %s waits for the periodic autoscaler", reply, slug)
    elif reply is not None:
        # Sending a Celery message blocks: in a thread of its own, off the event loop.
        sending = asyncio.ensure_future(sync_to_async(_wake_send, thread_sensitive=False)(slug))
        _waking.add(sending)
        sending.add_done_callback(_waking.discard)


def _wake_send(slug: str) -> None:
    try:
        app.send_task("inference.wake", args=[slug])
    except Exception:
        log.exception("inference router: waking %s failed; the periodic autoscaler will", slug)


def _released(reply) -> None:
    if isinstance(reply, Exception):
        log.error("inference router: %s; a slot or queue place stays counted", reply)


# When this process last recorded each key's use: ``last_used_at`` needs no finer grain.
_used_written: dict[str, float] = {}


def _key_used(redis: RedisBatch, prefix: str) -> None:
    now = time.time()
    if now - _used_written.get(prefix, 0.0) >= USED_WRITE_SECONDS:
        _used_written[prefix] = now
        used = f"{now:.3f}"
        redis.call(pack((b"SET", cache.used_key(prefix), used, b"EX", USED_TTL_SECONDS)), _logged)


def _logged(reply) -> None:
    if isinstance(reply, Exception):
        log.error("inference router: %s", reply)


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


class _Watches:
    """Requests that listen for their client leaving once they have run WATCH_AFTER_SECONDS:
    one timer for all of a process's requests rather than one each."""

    def __init__(self) -> None:
        self._running: dict[_Exchange, float] = {}  # in the order they started
        self._timer: asyncio.TimerHandle | None = None

    def add(self, exchange: _Exchange) -> None:
        loop = asyncio.get_running_loop()
        self._running[exchange] = loop.time()
        if self._timer is None:
            self._timer = loop.call_later(WATCH_AFTER_SECONDS, self._sweep)

    def remove(self, exchange: _Exchange) -> None:
        self._running.pop(exchange, None)
        if exchange.gone is not None:
            exchange.gone.cancel()

    def _sweep(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        due = loop.time() - WATCH_AFTER_SECONDS
        running = self._running
        started = []
        for exchange, since in running.items():
            if since > due:
                break
            started.append(exchange)
        for exchange in started:
            del running[exchange]
            exchange.watch()
        if running:
            first = next(iter(running.values()))
            self._timer = loop.call_later(max(first - due, 0.001), self._sweep)


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
  local counts, until_ = {}, {}
  if #candidates > 0 then
    counts = redis.call('HMGET', KEYS[1], unpack(candidates))
    until_ = redis.call('ZMSCORE', KEYS[5], unpack(candidates))
  end
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
_ACQUIRE_SHA = hashlib.sha1(_ACQUIRE.encode()).hexdigest().encode()


# --- metrics -------------------------------------------------------------------------------------

# (deployment, status) -> the counter's and the histogram's children: labels() looks up a lock
# and a dict each call, once per pair is enough.
_metric_children: dict[tuple[str, int], tuple] = {}


def _counted(deployment: str, status: int, seconds: float) -> None:
    children = _metric_children.get((deployment, status))
    if children is None:
        children = _metric_children[(deployment, status)] = (
            ROUTER_REQUESTS.labels(deployment, str(status)),
            ROUTER_LATENCY.labels(deployment),
        )
    children[0].inc()
    children[1].observe(seconds)


# --- plumbing ------------------------------------------------------------------------------------


async def _body(receive) -> bytes:
    try:
        return await read_body(receive, limit=BODY_LIMIT)
    except ClientGone:
        raise Refusal(400, "The client went away before sending its request.") from None
    except BodyTooLarge:
        raise Refusal(413, f"The request body is over {BODY_LIMIT // (1024 * 1024)} MiB.") from None


def _abort(send) -> None:
    """Close the client's connection mid-answer (uvicorn's cycle holds the transport)."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        raise ConnectionAbortedError("the replica failed mid-answer")
    transport.abort()


# --- a process's clients -------------------------------------------------------------------------


class _Clients:
    """A process's Redis connection, its replica connections and its watched requests, for one
    event loop (``_clients``; the lifespan's shutdown closes them, gpucap.edge.loops)."""

    def __init__(self) -> None:
        self.redis = RedisBatch(
            settings.INFERENCE_REDIS_URL,
            tracked_prefixes=(cache.route_key(""), cache.api_key_key("")),
        )
        self.replicas = ReplicaPool()
        self.watches = _Watches()

    async def aclose(self) -> None:
        closing = [*self.replicas.close(), *self.redis.close()]
        if closing:
            # Let the closes happen while the loop runs: a transport left to the garbage
            # collector after its loop ended may close a file descriptor reused meanwhile.
            await asyncio.wait(closing, timeout=5)


_clients: PerLoop[_Clients] = PerLoop(_Clients)


_ROUTES = {
    "/v1/models": {"GET": models_list},
    "/v1/chat/completions": {"POST": completion},
    "/v1/completions": {"POST": completion},
}
