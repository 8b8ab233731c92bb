"""The router's Redis client: commands pipelined over one connection, and local copies of the
route and key documents that Redis invalidates when they change (client-side caching)."""

import asyncio
import json
import os

import pytest
import redis

from gpucap.inference.redis_batch import RedisBatch, RedisReplyError, RedisUnavailable
from tests.conftest import TEST_ROUTER_REDIS_URL, run_in_new_loop

URL = TEST_ROUTER_REDIS_URL  # the router tests' database, under a prefix of this process
PREFIX = f"gpucap:test{os.getpid()}:batch:"
DOC = f"{PREFIX}doc:a"
OTHER = f"{PREFIX}doc:b"


@pytest.fixture
def store():
    client = redis.Redis.from_url(URL)
    client.delete(DOC, OTHER, f"{PREFIX}counter")
    yield client
    client.delete(DOC, OTHER, f"{PREFIX}counter")
    client.close()


def parse(raw: bytes | None):
    return None if raw is None else json.loads(raw)


def run(scenario):
    async def main():
        client = RedisBatch(URL, tracked_prefixes=(f"{PREFIX}doc:",))
        try:
            return await scenario(client)
        finally:
            await asyncio.wait(client.close(), timeout=5)

    return run_in_new_loop(main)


async def until(condition, what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_commands_sent_in_one_turn_get_their_own_replies_in_order(store):
    async def scenario(client):
        return await asyncio.gather(
            *(client.execute(b"INCR", f"{PREFIX}counter") for _ in range(20)),
            client.send((b"SET", f"{PREFIX}counter", 0), (b"GET", f"{PREFIX}counter")),
        )

    *counts, (done, value) = run(scenario)

    assert counts == list(range(1, 21))
    assert (done, value) == (b"OK", b"0")


def test_a_command_redis_refuses_raises_its_error(store):
    async def scenario(client):
        with pytest.raises(RedisReplyError, match="unknown command"):
            await client.execute(b"NO-SUCH-COMMAND")
        return await client.execute(b"PING")

    assert run(scenario) == b"PONG"


def test_a_document_read_once_is_kept_and_a_missing_one_too(store):
    store.set(DOC, json.dumps({"v": 1}))

    async def scenario(client):
        first = await client.documents((DOC, OTHER), (parse, parse))
        return first, dict(client.copies)

    (doc, missing), copies = run(scenario)

    assert (doc, missing) == ({"v": 1}, None)
    assert copies == {DOC: {"v": 1}, OTHER: None}


def test_a_changed_or_deleted_document_is_dropped_and_read_anew(store):
    store.set(DOC, json.dumps({"v": 1}))

    async def scenario(client):
        await client.documents((DOC, OTHER), (parse, parse))
        store.set(DOC, json.dumps({"v": 2}))
        store.set(OTHER, json.dumps({"v": 3}))
        await until(lambda: not client.copies, "the copies to be invalidated")
        changed = await client.documents((DOC, OTHER), (parse, parse))
        store.delete(DOC)
        await until(lambda: DOC not in client.copies, "the deleted document to be dropped")
        deleted = await client.documents((DOC,), (parse,))
        return changed, deleted

    changed, deleted = run(scenario)

    assert changed == [{"v": 2}, {"v": 3}]
    assert deleted == [None]


def test_without_its_invalidations_the_client_keeps_no_copies(store):
    store.set(DOC, json.dumps({"v": 1}))

    async def scenario(client):
        await client.documents((DOC,), (parse,))
        assert client.copies == {DOC: {"v": 1}}
        client._invalidations.transport.abort()  # the invalidation connection drops
        await until(lambda: not client.copies, "the copies to be dropped")
        store.set(DOC, json.dumps({"v": 2}))
        read = await client.documents((DOC,), (parse,))
        return read, dict(client.copies)

    read, copies = run(scenario)

    assert read == [{"v": 2}]
    assert copies == {}


def test_an_unreachable_redis_fails_each_command_with_redis_unavailable():
    async def scenario(client):
        with pytest.raises(RedisUnavailable):
            await client.execute(b"PING")
        with pytest.raises(RedisUnavailable):
            await client.documents((DOC,), (parse,))

    async def main():
        client = RedisBatch("redis://127.0.0.1:1/0", tracked_prefixes=(f"{PREFIX}doc:",))
        await scenario(client)

    run_in_new_loop(main)
