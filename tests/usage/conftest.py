"""Usage fixtures: a clock the lifecycle reads (so intervals start and end when a test says),
and VMs driven through the lifecycle services."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from gpucap.allocation.models import Reservation
from gpucap.rentals import services
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import grant_pools, request_vm


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def set(self, moment: datetime) -> datetime:
        self.now = moment
        return moment

    def advance(self, **delta) -> datetime:
        self.now += timedelta(**delta)
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """``timezone.now()`` everywhere (services, auto_now fields) reads this clock."""
    the_clock = Clock(datetime(2026, 11, 2, 10, 20, 0, tzinfo=UTC))
    monkeypatch.setattr(timezone, "now", the_clock)
    return the_clock


@pytest.fixture
def pools(fleet_east, tenant, other_tenant) -> dict:
    return grant_pools(fleet_east, tenant, other_tenant)


@pytest.fixture
def run_vm(fleet_east):
    """``run_vm(tenant, "h100-spot", node, [0, 1])``: a VM placed and running at the clock."""

    def run(tenant, pool: str, node: str, gpus: list[int], *, name: str):
        vm = request_vm(tenant, fleet_east["pools"][pool], name=name, gpu_count=len(gpus))
        vm = services.vm_place(vm=vm, node=fleet_east["nodes"][node], gpu_indices=gpus)
        return services.vm_mark_running(vm=vm, ip_address="10.0.0.7")

    return run


def reserve(tenant, capacity_set, *, name: str = "train-block", gpus: int = 8) -> Reservation:
    """A reservation of whole 8-GPU blocks, in force at all times."""
    return Reservation.objects.create(
        tenant=tenant, capacity_set=capacity_set, name=name, gpus=gpus, block_gpus=8, always=True
    )


@pytest.fixture
def place(fleet_east, pools):
    """``place(tenant, pool, node, gpus, name=..., reservation=..., borrowed_from=...)``: a VM
    running at the clock, its flags written as a plan writes them, before it is placed."""

    def run(tenant, pool: str, node: str, gpus: list[int], *, name: str, **flags):
        vm = request_vm(tenant, fleet_east["pools"][pool], name=name, gpu_count=len(gpus))
        VirtualMachine.objects.filter(pk=vm.pk).update(**flags)
        vm = services.vm_place(vm=vm, node=fleet_east["nodes"][node], gpu_indices=gpus)
        return services.vm_mark_running(vm=vm, ip_address="10.0.0.9")

    return run
