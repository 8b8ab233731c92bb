"""Tests share Redis with other programs: cleaning up deletes only the keys named, never the
database."""

import os

import redis

from gpucap.redis_clients import keys_delete
from tests.conftest import TEST_INFERENCE_REDIS_URL


def test_keys_delete_takes_only_the_matching_keys():
    client = redis.Redis.from_url(TEST_INFERENCE_REDIS_URL)
    mine = [f"gpucap:test{os.getpid()}:k{n}" for n in range(1203)]
    neighbour = f"someone-else:{os.getpid()}"
    client.mset(dict.fromkeys([*mine, neighbour], "x"))
    try:
        assert keys_delete(client, f"gpucap:test{os.getpid()}:*") == 1203
        assert client.exists(*mine) == 0
        assert client.get(neighbour) == b"x"
    finally:
        client.delete(neighbour, *mine)
