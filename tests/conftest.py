"""Fixtures shared by the whole suite: three kinds of user and a small fleet.

- ``operator``: staff in the operators group, sees and changes the whole fleet;
- ``member``: a member of tenant ``acme``;
- ``other_member``: a member of tenant ``globex``, who must never see acme's things.
"""

import asyncio
import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Coroutine

import pytest
from django.contrib.auth.models import Group, User
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster
from gpucap.redis_clients import keys_delete
from gpucap.roles import OPERATORS_GROUP
from gpucap.tenancy import password_attempts
from gpucap.tenancy.models import Membership, Tenant

PASSWORD = "correct-horse-battery"


@pytest.fixture(autouse=True)
def password_attempts_of_this_test(monkeypatch):
    """Each test counts password attempts under a prefix of its own: the cache is shared by
    test runs, and one test's wrong passwords must not lock another's sign-ins."""
    prefix = f"password-attempts-test-{uuid.uuid4().hex}"
    monkeypatch.setattr(password_attempts, "KEY_PREFIX", prefix)
    yield
    with contextlib.suppress(Exception):  # Redis gone (a fault test): the keys expire anyway
        keys_delete(cache._cache.get_client(write=True), f"*{prefix}*")


@pytest.fixture
def operator(db) -> User:
    user = User.objects.create_user("olivia", "olivia@ops.example", PASSWORD, is_staff=True)
    group, _ = Group.objects.get_or_create(name=OPERATORS_GROUP)
    user.groups.add(group)
    return user


@pytest.fixture
def tenant(db) -> Tenant:
    return Tenant.objects.create(name="Acme AI", slug="acme")


@pytest.fixture
def other_tenant(db) -> Tenant:
    return Tenant.objects.create(name="Globex Research", slug="globex")


@pytest.fixture
def member(tenant) -> User:
    user = User.objects.create_user("mallory", "mallory@acme.example", PASSWORD)
    Membership.objects.create(user=user, tenant=tenant, role=Membership.Role.ADMIN)
    return user


@pytest.fixture
def other_member(other_tenant) -> User:
    user = User.objects.create_user("oscar", "oscar@globex.example", PASSWORD)
    Membership.objects.create(user=user, tenant=other_tenant, role=Membership.Role.MEMBER)
    return user


def _api_client(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def run_in_new_loop(main: Callable[[], Coroutine]) -> object:
    """``asyncio.run(main())`` in a thread of its own. A browser test's Playwright (sync API)
    leaves its event loop marked as running in the main thread, and asyncio.run refuses to
    start under a running loop."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["value"] = asyncio.run(main())
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator_client(operator) -> Client:
    """A browser session of the operator (pages)."""
    return _logged_in(operator)


@pytest.fixture
def member_client(member) -> Client:
    return _logged_in(member)


@pytest.fixture
def other_member_client(other_member) -> Client:
    return _logged_in(other_member)


@pytest.fixture
def operator_api(operator) -> APIClient:
    return _api_client(operator)


@pytest.fixture
def member_api(member) -> APIClient:
    return _api_client(member)


@pytest.fixture
def other_member_api(other_member) -> APIClient:
    return _api_client(other_member)


@pytest.fixture
def anonymous_api() -> APIClient:
    return _api_client(None)


@pytest.fixture
def fleet_east(db, tenant, other_tenant):
    """The fleet most tests run on (``fleet_east_build``)."""
    return fleet_east_build(tenant, other_tenant)


def fleet_east_build(tenant: Tenant, other_tenant: Tenant) -> dict:
    """Cluster ``east``: an NVSwitch H100 set of two 8-GPU nodes (one with a non-adjacent
    partition table), a PCIe L40S set of two 4-GPU nodes, one standalone node, and pools of all
    three kinds. Tenant acme may use ``h100-spot``; globex may use ``l40s-ondemand``. Its image
    catalogue offers ``ubuntu-24.04-cuda-12.6`` (user ubuntu) and the replicas'
    ``gpucap-model-server`` (port 8000)."""
    cluster = fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)
    h100 = fleet.capacity_set_create(
        cluster=cluster, name="h100-east", gpu_model="H100-SXM5-80GB", fabric="nvswitch"
    )
    l40s = fleet.capacity_set_create(
        cluster=cluster, name="l40s-east", gpu_model="L40S", fabric="pcie"
    )
    hgx_pairs = [
        [0, 1, 2, 3, 4, 5, 6, 7],
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [0, 2],
        [1, 3],
        [4, 6],
        [5, 7],
        [0],
        [1],
        [2],
        [3],
        [4],
        [5],
        [6],
        [7],
    ]
    nodes = {}
    for hostname, partitions in (("h100-001", None), ("h100-002", hgx_pairs)):
        nodes[hostname] = fleet.node_create(
            cluster=cluster,
            hostname=hostname,
            gpu_model="H100-SXM5-80GB",
            fabric="nvswitch",
            gpu_count=8,
            partitions=partitions,
        )
        nodes[hostname] = fleet.node_join_set(node=nodes[hostname], capacity_set=h100)
    for hostname in ("l40s-001", "l40s-002"):
        nodes[hostname] = fleet.node_create(
            cluster=cluster, hostname=hostname, gpu_model="L40S", fabric="pcie", gpu_count=4
        )
        nodes[hostname] = fleet.node_join_set(node=nodes[hostname], capacity_set=l40s)
    nodes["a100-001"] = fleet.node_create(
        cluster=cluster,
        hostname="a100-001",
        gpu_model="A100-SXM4-80GB",
        fabric="nvswitch",
        gpu_count=8,
    )
    pools = {
        "h100-inference": fleet.pool_create(
            name="h100-inference",
            kind="inference",
            cluster=cluster,
            capacity_set=h100,
            rank=1,
            floor_gpus=4,
        ),
        "h100-ondemand": fleet.pool_create(
            name="h100-ondemand", kind="on_demand", cluster=cluster, capacity_set=h100, rank=2
        ),
        "h100-spot": fleet.pool_create(
            name="h100-spot", kind="spot", cluster=cluster, capacity_set=h100, rank=3
        ),
        "l40s-ondemand": fleet.pool_create(
            name="l40s-ondemand", kind="on_demand", cluster=cluster, capacity_set=l40s, rank=1
        ),
        "a100-standalone": fleet.pool_create(
            name="a100-standalone",
            kind="on_demand",
            cluster=cluster,
            rank=1,
            gpu_model="A100-SXM4-80GB",
            fabric="nvswitch",
        ),
    }
    fleet.pool_set_tenants(pool=pools["h100-spot"], tenants=[tenant])
    fleet.pool_set_tenants(pool=pools["l40s-ondemand"], tenants=[other_tenant])
    images = {
        "ubuntu-24.04-cuda-12.6": fleet.image_create(
            cluster=cluster,
            name="ubuntu-24.04-cuda-12.6",
            base_image="/var/lib/gpucap/images/ubuntu-24.04-cuda-12.6.qcow2",
            default_user="ubuntu",
        ),
        "gpucap-model-server": fleet.image_create(
            cluster=cluster,
            name="gpucap-model-server",
            base_image="/var/lib/gpucap/images/gpucap-model-server.qcow2",
            ports=[8000],
        ),
    }
    return {
        "images": images,
        "cluster": cluster,
        "sets": {"h100-east": h100, "l40s-east": l40s},
        "nodes": nodes,
        "pools": pools,
    }


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix) -> None:
    """One test database per pytest process, so parallel runs on one machine never collide."""
    from django.conf import settings

    test = settings.DATABASES["default"].setdefault("TEST", {})
    test["NAME"] = f"test_{settings.DATABASES['default']['NAME']}_{os.getpid()}"


@pytest.fixture(autouse=True)
def no_kept_snapshots():
    """Each test starts with no set snapshot kept in the process (gpucap/plans/snapshot_cache.py):
    a rolled-back test's set may come round again with its id and generation."""
    from gpucap.plans import snapshot_cache

    snapshot_cache.forget()
    yield
    snapshot_cache.forget()


# Rows a transactional test's teardown leaves: what migrations and their post_migrate made once
# (content types, permissions) and never a test; everything else is deleted.
KEPT_TABLES = frozenset({"django_content_type", "auth_permission", "django_migrations"})


def _empty_the_tables(test_case) -> None:
    """A transactional test's teardown: every row its test wrote deleted in one transaction
    (Django's foreign keys on PostgreSQL are deferred, so the order does not matter), instead of
    Django's flush, which truncates every table (a new file for each table and index) and then
    creates the content types and permissions again (0.34 s a test, against 0.04 s; a third of
    the suite is transactional). What the next test sees is the same: empty tables; ids go on
    from where they were, as after flush without reset_sequences."""
    from django.db import connections, transaction

    for alias in test_case._databases_names(include_mirrors=False):
        connection = connections[alias]
        tables = connection.introspection.django_table_names(
            only_existing=True, include_views=False
        )
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            for table in sorted(set(tables) - KEPT_TABLES):
                cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")


@pytest.fixture(scope="session", autouse=True)
def fast_transactional_teardown():
    """Transactional tests (``transaction=True``, live servers, real workers) end by deleting
    their rows (``_empty_the_tables``), not by Django's flush; the suite sets neither
    ``available_apps`` nor ``serialized_rollback``, the cases where flush does something else."""
    from django.test import TransactionTestCase

    previous = TransactionTestCase._fixture_teardown
    TransactionTestCase._fixture_teardown = _empty_the_tables
    yield
    TransactionTestCase._fixture_teardown = previous


@pytest.fixture(scope="session", autouse=True)
def fast_password_hashing():
    """Passwords hashed with one MD5 round instead of PBKDF2's million: every test makes users
    and logs them in, and half a second a hash would double the suite's time. What hashing is
    used is Django's business; the tests check who may log in and what they see."""
    from django.conf import settings
    from django.contrib.auth import hashers

    previous = settings.PASSWORD_HASHERS
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    hashers.get_hashers.cache_clear()
    hashers.get_hashers_by_algorithm.cache_clear()
    yield
    settings.PASSWORD_HASHERS = previous
    hashers.get_hashers.cache_clear()
    hashers.get_hashers_by_algorithm.cache_clear()


# The Redis databases test runs write to, from the environment (the README's "Tests"): tests
# delete only the keys they wrote, so a database may be shared, but never pick one that holds
# anything another program needs emptied or intact under gpucap's key names.
TEST_BROKER_URL = os.environ.get("TEST_BROKER_URL", "redis://127.0.0.1:6379/15")
TEST_METADATA_REDIS_URL = os.environ.get("TEST_METADATA_REDIS_URL", "redis://127.0.0.1:6379/14")
TEST_INFERENCE_REDIS_URL = os.environ.get("TEST_INFERENCE_REDIS_URL", "redis://127.0.0.1:6379/13")
TEST_ROUTER_REDIS_URL = os.environ.get("TEST_ROUTER_REDIS_URL", "redis://127.0.0.1:6379/11")
TEST_METRICS_REDIS_URL = os.environ.get("TEST_METRICS_REDIS_URL", "redis://127.0.0.1:6379/9")


@pytest.fixture(scope="session", autouse=True)
def celery_test_broker():
    """Tasks enqueued by services during tests go to a Redis database of their own, never to
    the queue a developer's `make run` worker consumes."""
    from gpucap.celery import app

    previous = app.conf.broker_url
    app.conf.broker_url = TEST_BROKER_URL
    yield TEST_BROKER_URL
    app.conf.broker_url = previous


@pytest.fixture(scope="session", autouse=True)
def simulated_fleet_empty(django_db_modify_db_settings):
    """The simulated driver keeps its fleet in Redis under the database's name. Each session
    starts and ends with an empty one, so a test database whose name comes round again (a
    recycled pid) never meets an earlier run's VMs."""
    import redis
    from django.conf import settings

    from gpucap.drivers.simulated import SimulatedDriver

    fleet = SimulatedDriver(namespace=settings.DATABASES["default"]["TEST"]["NAME"])
    # Redis down: nothing to empty, and the tests that need Redis will say it is down.
    with contextlib.suppress(redis.ConnectionError):
        fleet.reset()
    yield
    with contextlib.suppress(redis.ConnectionError):
        fleet.reset()


@pytest.fixture(scope="session", autouse=True)
def metadata_test_redis():
    """The metadata cache of test runs lives in a Redis database of its own
    (TEST_METADATA_REDIS_URL), a store that counts as synced: a document that is absent there
    is a VM that does not exist (the tests of an empty store use a Redis of their own)."""
    import redis
    from django.conf import settings

    from gpucap.notices.cache import SYNCED_KEY
    from gpucap.redis_clients import metadata_redis

    previous = settings.METADATA_REDIS_URL
    settings.METADATA_REDIS_URL = TEST_METADATA_REDIS_URL
    client = metadata_redis()
    # Redis down: the tests that need Redis will say it is down.
    with contextlib.suppress(redis.ConnectionError):
        client.set(SYNCED_KEY, "0")
    yield client
    settings.METADATA_REDIS_URL = previous


@pytest.fixture
def own_redis(tmp_path):
    """A started Redis server of this test's own on a free port (tests/redis_server.py), to
    stop or restart empty; killed at teardown."""
    from tests.redis_server import RedisServer

    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
