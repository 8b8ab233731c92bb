"""The inference router's connections to replicas.

Replicas speak HTTP/1.1. Each router process keeps idle keep-alive connections per replica
and parses answers with httptools, the C parser uvicorn itself uses. A general-purpose client
(httpx2, aiohttp) costs several times the router's whole budget per request in Python and
sends a request's head and body as separate segments; here a request is one write.
"""

import asyncio
import ssl as ssl_module
import time
from collections import deque
from functools import lru_cache
from typing import NamedTuple
from urllib.parse import urlsplit

import httptools

CONNECT_TIMEOUT_SECONDS = 3
# Replicas (uvicorn, vLLM) close idle connections after 5 s: reuse them for less than that.
KEEPALIVE_SECONDS = 4


class ReplicaFailed(Exception):
    """The replica's connection failed: refused, reset, closed early, or garbled."""


_HEAD, _END = object(), object()  # events of an answer, between its chunks of body


class ReplicaConnection(asyncio.Protocol):
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


class ReplicaPool:
    """Idle keep-alive connections per replica address, for one event loop."""

    def __init__(self) -> None:
        self._idle: dict[tuple, list[ReplicaConnection]] = {}

    async def exchange(self, target: "Target", head: bytes, body: bytes) -> ReplicaConnection:
        """Send a request; return the connection once the answer's head is in. A reused
        connection that turns out closed is replaced once: idle connections die quietly."""
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

    def give_back(self, connection: ReplicaConnection) -> None:
        """Keep the connection for the next request if its exchange ended cleanly."""
        if connection.complete and connection.keep_alive and connection.usable:
            connection.reused = True
            connection.idle_since = time.monotonic()
            self._idle.setdefault(connection.target, []).append(connection)
        else:
            connection.close()

    async def _connection(self, target: "Target") -> ReplicaConnection:
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
                    ReplicaConnection,
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


class Target(NamedTuple):
    address: tuple  # (scheme, host, port): what a connection is kept for
    host: str
    port: int
    ssl: ssl_module.SSLContext | None
    host_header: str
    path: str


@lru_cache(maxsize=4096)
def replica_target(url: str) -> Target:
    """Where a replica's endpoint URL is reached."""
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    return Target(
        address=(parts.scheme, parts.hostname, port),
        host=parts.hostname,
        port=port,
        ssl=ssl_module.create_default_context() if secure else None,
        host_header=parts.netloc.rpartition("@")[2],
        path=parts.path.rstrip("/"),
    )
