"""Schedule fixtures: the full h100-east set of the plans tests (four running 4-GPU spot VMs of
acme) and an inference deployment of acme's in h100-inference that keeps no replica of its own,
so a schedule raising its minimum is what makes it ask for GPUs."""

from datetime import UTC, datetime

import pytest

from gpucap.fleet import services as fleet
from gpucap.inference import services as inference
from tests.plans.conftest import full_set, h100  # noqa: F401  (fixtures)

# Wednesday 2 December 2026, 12:00 UTC = 07:00 in New York.
NOON = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def chat(fleet_east, tenant, member):
    """acme's deployment ``acme-chat`` in h100-inference: 4-GPU replicas, 0 to 4 of them."""
    fleet.pool_set_tenants(pool=fleet_east["pools"]["h100-inference"], tenants=[tenant])
    return inference.deployment_create(
        tenant=tenant,
        pool=fleet_east["pools"]["h100-inference"],
        name="chat",
        model_name="gpucap/sim-8b",
        gpus_per_replica=4,
        min_replicas=0,
        max_replicas=4,
        actor=member,
    )


def day_shift(**changes) -> dict:
    """The entry ``day-shift``: weekdays 08:00-20:00 in New York, setting ``changes``."""
    return {
        "name": "day-shift",
        "days": "mon-fri",
        "start": "08:00",
        "end": "20:00",
        "time_zone": "America/New_York",
        **changes,
    }
