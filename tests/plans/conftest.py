"""Plans fixtures: the ``h100-east`` set (two 8-GPU NVSwitch nodes) full of acme's spot VMs, and
globex allowed to rent on-demand VMs there, as in DESIGN.md section 8's story."""

from datetime import timedelta

import pytest

from gpucap.fleet import services as fleet
from gpucap.rentals.models import VirtualMachine
from tests.rentals.conftest import _record_sent, sim  # noqa: F401  (fixtures)
from tests.rentals.vm_helpers import request_vm, running_vm


@pytest.fixture
def h100(fleet_east):
    return fleet_east["sets"]["h100-east"]


@pytest.fixture
def full_set(fleet_east, tenant, other_tenant) -> list[VirtualMachine]:
    """Four running 4-GPU spot VMs of acme filling both nodes of h100-east (started one minute
    apart, spot-1 first); globex may rent on-demand VMs in the set."""
    pools, nodes = fleet_east["pools"], fleet_east["nodes"]
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[other_tenant])
    spots = []
    for n, (node, gpus) in enumerate(
        [
            ("h100-001", [0, 1, 2, 3]),
            ("h100-001", [4, 5, 6, 7]),
            ("h100-002", [0, 1, 2, 3]),
            ("h100-002", [4, 5, 6, 7]),
        ],
        start=1,
    ):
        vm = running_vm(
            tenant, pools["h100-spot"], nodes[node], gpus, name=f"spot-{n}", ip=f"10.50.0.{n}"
        )
        VirtualMachine.objects.filter(pk=vm.pk).update(
            started_at=vm.started_at.replace(microsecond=0).replace(second=0)
            - timedelta(minutes=10 - n)
        )
        spots.append(VirtualMachine.objects.get(pk=vm.pk))
    return spots


@pytest.fixture
def on_demand_request(fleet_east, other_tenant, full_set):
    """Make globex's 8-GPU on-demand request in the full set."""

    def make(name: str = "train-1", gpu_count: int = 8) -> VirtualMachine:
        return request_vm(
            other_tenant, fleet_east["pools"]["h100-ondemand"], name=name, gpu_count=gpu_count
        )

    return make


@pytest.fixture
def sent_plan_tasks(monkeypatch) -> list[tuple[str, list]]:
    """The planning loop's tasks services send (``plans.*``), as ``(name, args)``; the broker
    gets nothing."""
    return _record_sent(monkeypatch, lambda name: name.startswith("plans."))
