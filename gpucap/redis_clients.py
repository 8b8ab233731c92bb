"""Every Redis client gpucap makes, built here from the settings that name its store.

- ``metadata_redis``: the instance metadata documents (``METADATA_REDIS_URL``);
- ``inference_redis``: the inference router's documents and counters (``INFERENCE_REDIS_URL``);
- ``shared_redis``: the project's own (``REDIS_URL``): replan debounce claims, the counters
  every process adds to, the simulated driver's fleet.

A synchronous client, with its connection pool, is made once per URL and process, on first use,
and the URL is read from the settings at every call: pointing a store elsewhere (a deployment's
environment, a test's ``settings``) is all it takes for the next call to use it. The ASGI apps
in front of Django make their asyncio clients with ``async_redis``, one per event loop
(gpucap.edge.loops). The router's pipelining connection is its own (gpucap.inference.redis_batch).
"""

import redis
import redis.asyncio as aioredis
from django.conf import settings

_clients: dict[tuple[str, bool], redis.Redis] = {}


def redis_client(url: str, *, decode_responses: bool = False) -> redis.Redis:
    """The process's client for ``url``. Two threads asking at once may each make one; the
    later simply replaces the earlier, which closes with its pool when collected."""
    key = (url, decode_responses)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = redis.Redis.from_url(url, decode_responses=decode_responses)
    return client


def metadata_redis() -> redis.Redis:
    return redis_client(settings.METADATA_REDIS_URL)


def inference_redis() -> redis.Redis:
    return redis_client(settings.INFERENCE_REDIS_URL)


def shared_redis() -> redis.Redis:
    return redis_client(settings.REDIS_URL)


def async_redis(url: str) -> aioredis.Redis:
    """A new asyncio client: the caller keeps one per event loop (``gpucap.edge.loops.PerLoop``)."""
    return aioredis.Redis.from_url(url)


def keys_delete(client: redis.Redis, pattern: str) -> int:
    """Delete the keys matching ``pattern`` (a glob such as ``gpucap:inference:*``), in batches,
    never the rest of the database: other programs may share it. Returns how many went."""
    deleted = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) == 500:
            deleted += client.delete(*batch)
            batch.clear()
    if batch:
        deleted += client.delete(*batch)
    return deleted
