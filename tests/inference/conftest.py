"""Inference fixtures: acme may deploy in h100-inference (the NVSwitch set of fleet_east) and in
a standalone inference pool on the cluster's A100 node; the router's Redis documents go to a
Redis database of the tests' own."""

import pytest

from gpucap.fleet import services as fleet
from gpucap.inference import cache
from gpucap.inference import services as inference
from gpucap.redis_clients import keys_delete
from tests.conftest import TEST_INFERENCE_REDIS_URL

# The Redis database the inference tests write their documents to (TEST_INFERENCE_REDIS_URL).
INFERENCE_TEST_REDIS = TEST_INFERENCE_REDIS_URL


@pytest.fixture(autouse=True)
def inference_redis(settings):
    """Each test starts with no route, key or counter documents (only gpucap's inference keys
    are deleted: other programs may share the database)."""
    settings.INFERENCE_REDIS_URL = INFERENCE_TEST_REDIS
    client = cache.inference_redis()
    keys_delete(client, f"{cache.PREFIX}*")
    client.set(cache.synced_key(), "0")  # synced, with nothing in it: the test database is empty
    yield client
    keys_delete(client, f"{cache.PREFIX}*")


@pytest.fixture
def inference_pools(fleet_east, tenant, other_tenant) -> dict:
    return inference_pools_build(fleet_east, tenant)


def inference_pools_build(fleet_east: dict, tenant) -> dict:
    """h100-inference (set h100-east, rank 1, floor 4) and a100-inference (standalone on
    a100-001), both open to acme."""
    pools = fleet_east["pools"]
    standalone = fleet.pool_create(
        name="a100-inference",
        kind="inference",
        cluster=fleet_east["cluster"],
        rank=2,
        gpu_model="A100-SXM4-80GB",
        fabric="nvswitch",
    )
    fleet.pool_set_tenants(pool=pools["h100-inference"], tenants=[tenant])
    fleet.pool_set_tenants(pool=standalone, tenants=[tenant])
    return {"set": pools["h100-inference"], "standalone": standalone}


@pytest.fixture
def deploy(tenant, inference_pools, member):
    """``deploy(name, where="standalone", **settings)``: a deployment of acme's."""

    def make(name: str = "chat", where: str = "standalone", **settings):
        settings.setdefault("gpus_per_replica", 1)
        return inference.deployment_create(
            tenant=tenant,
            pool=inference_pools[where],
            name=name,
            model_name="gpucap/sim-8b",
            actor=member,
            **settings,
        )

    return make
