"""Allocation fixtures: the fleet_east pools opened to the tenants (as the VM tests have them)
and the plans' fixtures."""

import pytest

from gpucap.allocation import services as allocation
from tests.plans.conftest import full_set, h100  # noqa: F401  (fixtures)
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.conftest import _record_sent, sim  # noqa: F401  (fixtures)

pools = rentals_fixtures.pools


@pytest.fixture
def quota(tenant, pools, operator):
    """``quota(max_gpus, pool="h100-spot")`` or ``quota(max_gpus, gpu_model=...)``."""

    def make(max_gpus: int, *, pool: str | None = "h100-spot", gpu_model: str = "", **kw):
        return allocation.quota_set(
            tenant=tenant,
            pool=None if gpu_model else pools[pool],
            gpu_model=gpu_model,
            max_gpus=max_gpus,
            actor=operator,
            **kw,
        )

    return make
