"""The set the simulator's Django-side tests share (issue 21), importable as fixtures.

h100-east is full of acme's four 4-GPU spot VMs (spot-1 oldest, tests/plans/conftest.py).
acme's chat deployment in h100-inference (rank 1) serves 1-second requests from 4-GPU replicas,
0..2 of them, 8 at once each, aiming at 4 in flight: ``LOAD``, 6 requests/s, asks for two
replicas, 8 GPUs, which the arbiter takes from the two most recently started spot VMs.
"""

import pytest

from gpucap.celery import app
from gpucap.inference import services as inference
from tests.inference import conftest as inference_fixtures
from tests.plans import conftest as plans_fixtures

full_set = plans_fixtures.full_set
inference_pools = inference_fixtures.inference_pools
inference_redis = inference_fixtures.inference_redis

LOAD = {"deployments": {"acme-chat": {"points": [[0, 6]], "service_seconds": 1.0}}}
# The edited policy of most comparisons: chat may not run at all.
NO_CHAT = {"deployments": {"acme-chat": {"max_replicas": 0}}}


@pytest.fixture
def chat(inference_pools, tenant, member):
    return inference.deployment_create(
        tenant=tenant,
        pool=inference_pools["set"],
        name="chat",
        model_name="gpucap/sim-8b",
        gpus_per_replica=4,
        min_replicas=0,
        max_replicas=2,
        actor=member,
    )


@pytest.fixture
def h100(fleet_east, full_set, chat):
    """h100-east, full, with acme's chat deployment."""
    return fleet_east["sets"]["h100-east"]


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, list]]:
    """The tasks sent to the broker, as ``(name, args)``; the broker gets nothing."""
    found: list[tuple[str, list]] = []
    monkeypatch.setattr(app, "send_task", lambda name, args=None, **_: found.append((name, args)))
    return found
