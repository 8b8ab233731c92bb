"""The inference router's Redis client: one connection per process and event loop, pipelined
across requests, with local copies of the documents the router reads.

Every command a request sends in one turn of the event loop leaves in the same write with the
other requests' commands, and Redis answers in order, so a reply goes to the oldest waiting
command: under load, a handful of requests share each system call. (redis-py's asyncio client
takes a pooled connection, a write and a read per command, with its hooks around each, several
times the router's budget; it has no automatic pipelining.)

A reply goes to a future (``command``) or straight to a callback (``call``): the callback runs
for every reply, even when whoever sent the command no longer waits, which is how the router
never loses track of a slot it was given.

Documents (route and key documents, gpucap.inference.cache) are kept in the process once read,
and Redis tells when they change: the connection turns on client-side caching in broadcast
mode for their key prefixes (``CLIENT TRACKING ... BCAST PREFIX``), with invalidations sent to
a second connection subscribed to ``__redis__:invalidate``. Redis sends the invalidation before
it answers the write that caused it, so once a service's write (a key's revocation) has
returned, the next request this process reads sees the change. When the invalidation
connection is lost, copies are dropped and every request reads Redis until it is back; a Redis
without client tracking (before 6.0) is read every time.
"""

import asyncio
import hashlib
import logging
import ssl as ssl_module
from collections import deque

from redis.connection import SSLConnection
from redis.connection import parse_url as redis_parse_url

CONNECT_TIMEOUT_SECONDS = 3
COPIES_LIMIT = 10_000  # documents kept per process; past it the copies start over
INVALIDATE_CHANNEL = b"__redis__:invalidate"

log = logging.getLogger(__name__)


class RedisUnavailable(Exception):
    """The router's Redis cannot be reached."""


class RedisReplyError(Exception):
    """Redis answered a command with an error."""


_INCOMPLETE = object()


class RedisBatch:
    """The commands the router needs, over one pipelined connection (re-made when lost)."""

    def __init__(self, url: str, *, tracked_prefixes: tuple[str, ...] = ()) -> None:
        self._options = parse_redis_url(url)
        self._tracked_prefixes = tracked_prefixes
        self._connection: _Connection | None = None
        self._invalidations: _Connection | None = None
        self._connecting: asyncio.Future | None = None
        self._calling: set[asyncio.Future] = set()  # commands waiting for a connection
        # Local copies of tracked documents: key -> parsed document (None: no such key).
        self.copies: dict[str, object] = {}
        self._tracking = False
        self._generation = 0  # bumped by every invalidation

    # --- commands

    def command(self, *args) -> asyncio.Future:
        """Send one command (in one write with whatever else this turn of the loop sends).
        The future holds its reply; it completes whether or not anyone still waits for it."""
        future = asyncio.get_running_loop().create_future()
        self.call(pack(args), future)
        return future

    def call(self, packed: bytes, reply) -> None:
        """Send one packed command; ``reply`` is a future, or a callable given the reply (a
        RedisReplyError or RedisUnavailable instance when it failed)."""
        connection = self._connection
        if connection is None or not connection.usable:
            calling = asyncio.ensure_future(self._connected_call(packed, reply))
            self._calling.add(calling)
            calling.add_done_callback(self._calling.discard)
            return
        connection.send(packed, reply)

    def send(self, *commands: tuple) -> asyncio.Future:
        """Several commands: the future holds their replies, or the first error."""
        return _replies([self.command(*command) for command in commands])

    async def execute(self, *args):
        return await self.command(*args)

    # --- documents

    async def documents(self, keys: tuple[str, ...], parsers: tuple) -> list:
        """The documents at ``keys``, each parsed by its parser (given the raw bytes or None),
        from the local copies, or read in one MGET (and kept when Redis tracks them)."""
        copies = self.copies
        missing = [n for n, key in enumerate(keys) if key not in copies]
        if not missing:
            return [copies[key] for key in keys]
        if self._connection is None or not self._connection.usable:
            await self._connect()  # connecting starts the copies over: it comes first
        generation = self._generation
        raw = await self.command(b"MGET", *(keys[n] for n in missing))
        found = [copies.get(key) for key in keys]
        keep = self._tracking and generation == self._generation
        if keep and len(copies) + len(missing) > COPIES_LIMIT:
            copies.clear()
        for n, value in zip(missing, raw, strict=True):
            found[n] = parsers[n](value)
            if keep:
                copies[keys[n]] = found[n]
        return found

    def _invalidated(self, message) -> None:
        """A message on the invalidation channel: the keys that changed, or None (all)."""
        if not isinstance(message, list) or len(message) != 3 or message[0] != b"message":
            return
        self._generation += 1
        keys = message[2]
        if keys is None:
            self.copies.clear()
            return
        copies = self.copies
        for key in keys:
            copies.pop(key.decode(), None)

    def _connection_lost(self, _connection) -> None:
        """Redis forgets a lost connection's tracking: so do the copies."""
        self._tracking_lost(None)
        invalidations, self._invalidations = self._invalidations, None
        if invalidations is not None:
            invalidations.on_lost = None
            invalidations.close()

    def _tracking_lost(self, _connection) -> None:
        self._tracking = False
        self._generation += 1
        self.copies.clear()

    # --- connecting

    async def _connected_call(self, packed: bytes, reply) -> None:
        try:
            connection = await self._connect()
        except RedisUnavailable as error:
            _deliver(reply, error)
            return
        connection.send(packed, reply)

    async def _connect(self) -> "_Connection":
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _open(self) -> "_Connection":
        connection = await self._open_one()
        for old in (self._connection, self._invalidations):
            if old is not None:
                old.on_lost = None
                old.close()
        self._connection, self._invalidations = connection, None
        self._tracking_lost(None)
        connection.on_lost = self._connection_lost
        if self._tracked_prefixes:
            await self._track(connection)
        return connection

    async def _open_one(self) -> "_Connection":
        options = self._options
        loop = asyncio.get_running_loop()
        try:
            if options.get("path"):
                opening = loop.create_unix_connection(_Connection, options["path"])
            else:
                opening = loop.create_connection(
                    _Connection,
                    options.get("host", "localhost"),
                    options.get("port", 6379),
                    ssl=ssl_module.create_default_context() if options.get("ssl") else None,
                )
            _, connection = await asyncio.wait_for(opening, CONNECT_TIMEOUT_SECONDS)
        except (OSError, TimeoutError) as error:
            raise RedisUnavailable(f"cannot connect to Redis: {error}") from None
        if options.get("password"):
            user = [options["username"]] if options.get("username") else []
            await connection.command(b"AUTH", *user, options["password"])
        if options.get("db"):
            await connection.command(b"SELECT", options["db"])
        return connection

    async def _track(self, connection: "_Connection") -> None:
        """Turn on broadcast tracking of the documents' prefixes, invalidations going to a
        subscriber connection of this client's own. Without it, documents are read each time."""
        invalidations = None
        try:
            invalidations = await self._open_one()
            client_id = await invalidations.command(b"CLIENT", b"ID")
            await invalidations.command(b"SUBSCRIBE", INVALIDATE_CHANNEL)
            invalidations.on_push = self._invalidated
            invalidations.on_lost = self._tracking_lost
            prefixes = [part for p in self._tracked_prefixes for part in (b"PREFIX", p)]
            await connection.command(
                b"CLIENT", b"TRACKING", b"ON", b"REDIRECT", client_id, b"BCAST", *prefixes
            )
        except (RedisReplyError, RedisUnavailable) as error:
            log.warning("inference router: no client-side caching (%s); reading each time", error)
            if invalidations is not None:
                invalidations.close()
            return
        self._invalidations = invalidations
        self._tracking = True

    def close(self) -> list[asyncio.Future]:
        closing = []
        for connection in (self._connection, self._invalidations):
            if connection is not None:
                connection.on_lost = None
                done = connection.close()
                if done is not None:
                    closing.append(done)
        self._connection = self._invalidations = None
        return closing


def _deliver(reply, value) -> None:
    if isinstance(reply, asyncio.Future):
        if reply.done():  # its caller stopped waiting; the command happened all the same
            return
        if isinstance(value, Exception):
            reply.set_exception(value)
        else:
            reply.set_result(value)
    else:
        reply(value)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiting: deque = deque()
        self._outgoing: list[bytes] = []
        self._lost: Exception | None = None
        self.closed: asyncio.Future | None = None  # done once the connection is gone
        self.on_push = None  # given replies nobody waits for (a subscriber's messages)
        self.on_lost = None

    @property
    def usable(self) -> bool:
        return self._lost is None and self.transport is not None

    def command(self, *args) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.send(pack(args), future)
        return future

    def send(self, packed: bytes, reply) -> None:
        if self._lost is not None:
            _deliver(reply, RedisUnavailable(str(self._lost)))
            return
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing.append(packed)
        self._waiting.append(reply)

    def _flush(self) -> None:
        if self._outgoing and self.usable:
            self.transport.write(b"".join(self._outgoing))
        self._outgoing.clear()

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        buffer, position, waiting = self._buffer, 0, self._waiting
        while waiting or self.on_push is not None:
            try:
                parsed = parse_reply(buffer, position)
            except (RedisUnavailable, ValueError) as error:
                self._lost = error  # out of step with Redis: every waiting reply is lost
                self.transport.close()
                return
            if parsed is _INCOMPLETE:
                break
            reply, position = parsed
            if waiting:
                _deliver(waiting.popleft(), reply)
            else:
                self.on_push(reply)
        del buffer[:position]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set_result(None)
        self._lost = exc or ConnectionResetError("Redis closed the connection")
        error = RedisUnavailable(str(self._lost))
        while self._waiting:
            _deliver(self._waiting.popleft(), error)
        if self.on_lost is not None:
            self.on_lost(self)

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


def bulk(arg: bytes) -> bytes:
    """One argument of a command in Redis's protocol (to pack a command's fixed parts once)."""
    return b"$%d\r\n%b\r\n" % (len(arg), arg)


def as_eval(packed: bytes, script: str) -> bytes:
    """A packed EVALSHA of ``script`` as the EVAL of its text (for a Redis that lost it)."""
    sha = hashlib.sha1(script.encode()).hexdigest().encode()
    return packed.replace(bulk(b"EVALSHA") + bulk(sha), bulk(b"EVAL") + bulk(script.encode()), 1)


def pack(args) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if arg.__class__ is not bytes:
            arg = (arg if arg.__class__ is str else str(arg)).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(parts)


def parse_reply(buffer: bytearray, position: int):
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
            parsed = parse_reply(buffer, after)
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


def parse_redis_url(url: str) -> dict:
    options = dict(redis_parse_url(url))
    if options.pop("connection_class", None) is SSLConnection:
        options["ssl"] = True
    return options
